"""Dual vs one-sided learned matching: learning-rate grid at equal step budgets on the lmc-dm full-size GPT-NeoX pair.

Usage: python probe.py OUT_DIR method:lr:steps[:seed] ...   (method: one | dual; seed: data order and λ draws)
Trains the pair of `modeconn experiment lmc-dm` (same seeds, same bytes) once into OUT_DIR/{a,b}.safetensors, computes
weight matching once, and appends one results.json entry per run: the held-out barrier_mean (200 test blocks, 11 λ),
the training objective and seconds. Results of the session-3 run: results.json next to this file.
"""
import json
import sys
import time
from pathlib import Path

import torch

from modeconn.data import load_dataset, make_loader
from modeconn.experiments.lmc_dm import GROUPS
from modeconn.experiments.transformer_wm import SIZES, train_pair
from modeconn.io import load_state_dict, save_state_dict
from modeconn.match import dual_matching, one_sided_matching, weight_matching
from modeconn.models import build_model
from modeconn.path import evaluate_path
from modeconn.symmetry import absorb_normalization
from modeconn.symmetry.hf import hf_symmetry_spec

OUT = Path(sys.argv[1])
size = SIZES["full"]
bundle = load_dataset("austen", None, vocab_size=size.vocab_size, context_length=size.context, limit_train=size.limit_train)
def build(seed):
    return build_model("gpt-neox-tiny", in_shape=(size.context,), num_classes=bundle.num_classes, seed=seed,
                       hidden_size=size.hidden_size, num_hidden_layers=size.layers,
                       num_attention_heads=size.heads, intermediate_size=size.intermediate)
if not (OUT / "b.safetensors").exists():
    models = train_pair(size, bundle, print)
    for n, m in zip("ab", models):
        save_state_dict(OUT / f"{n}.safetensors", m.state_dict())
models = []
for i, n in enumerate("ab"):
    m = build(i); m.load_state_dict(load_state_dict(OUT / f"{n}.safetensors")); models.append(m.eval())
a, b = models
abs_a, abs_b = absorb_normalization(a), absorb_normalization(b)
sa, sb = abs_a.state_dict(), abs_b.state_dict()
spec = hf_symmetry_spec(abs_a, groups=GROUPS)
wm = weight_matching(spec, sa, sb)
test = torch.utils.data.Subset(bundle.test, range(200))
evl = {"test": make_loader(test, 16)}
res_path = OUT / "results.json"
results = json.loads(res_path.read_text()) if res_path.exists() else {}
grid = [x.split(":") for x in sys.argv[2:]]  # method:lr:steps
for method, lr, steps, *rest in grid:
    lseed = int(rest[0]) if rest else 0
    key = f"{method}:{lr}:{steps}" + (f":{lseed}" if rest else "")
    if key in results:
        continue
    loader = make_loader(bundle.train, 32, shuffle=True, seed=lseed)
    t = time.perf_counter()
    fn = dual_matching if method == "dual" else one_sided_matching
    res = fn(spec, abs_a, sa, sb, loader, steps=int(steps), lr=float(lr), lambda_schedule="uniform", init="weight", weight_alignment=wm, seed=lseed)
    sec = time.perf_counter() - t
    if method == "dual":
        c = evaluate_path(abs_a, res.apply_a(sa), res.apply_b(sb), evl, lambdas=11)
    else:
        c = evaluate_path(abs_a, sa, res.apply(sb), evl, lambdas=11)
    results[key] = {"barrier_mean": c.barrier("mean", "test"), "objective": res.objective, "seconds": sec,
                    "loss_first50": sum(res.history[0][:50]) / 50, "loss_last50": sum(res.history[0][-50:]) / 50}
    print(key, results[key], flush=True)
    res_path.write_text(json.dumps(results, indent=1))

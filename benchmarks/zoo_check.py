"""The vision zoo check (#18): real torchvision and timm model definitions (random init) through modeconn.

For each model: ``symmetry_spec`` (self-check on), which floating tensors stay unbound (only the classifier's bias
may), the function check on a perturbed copy at rtol 1e-5, planted recovery by weight matching, ``merge`` with
BatchNorm reset and with REPAIR, and ``evaluate_path`` on a few random batches. Writes
``docs/results/zoo/zoo.json`` and ``zoo.md``. Needs torchvision (torch 2.14.1 + torchvision 0.29.1) and timm:

    python benchmarks/zoo_check.py [MODEL ...]
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import modeconn as mc
from modeconn.symmetry.selfcheck import check_function_preserved

TORCHVISION = ["resnet18", "resnet50", "resnext50_32x4d", "wide_resnet50_2", "regnet_x_400mf", "regnet_y_400mf",
               "vgg11_bn", "alexnet", "squeezenet1_0", "densenet121", "mobilenet_v2", "mobilenet_v3_small",
               "mnasnet0_5", "googlenet", "shufflenet_v2_x0_5", "efficientnet_b0", "efficientnet_v2_s",
               "convnext_tiny", "vit_b_16", "swin_t"]
TIMM = ["timm/resnet18d", "timm/efficientnet_b0", "timm/convnext_atto", "timm/vit_tiny_patch16_224", "timm/dla34",
        "timm/regnetx_002", "timm/mobilenetv3_small_100", "timm/resnext26ts"]
SIZE = {"vit_b_16": 224, "swin_t": 224, "alexnet": 224, "googlenet": 224, "timm/vit_tiny_patch16_224": 224}
OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "zoo"


def build(name: str) -> torch.nn.Module:
    if name.startswith("timm/"):
        import timm

        return timm.create_model(name[5:], pretrained=False, num_classes=10)
    import torchvision.models as tvm

    kw = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    return getattr(tvm, name)(weights=None, num_classes=10, **kw)


def check(name: str) -> dict:
    t0 = time.perf_counter()
    torch.manual_seed(0)
    a, b = build(name).eval(), build(name).eval()
    size = SIZE.get(name, 64)
    x = torch.randn(2, 3, size, size)
    spec = mc.symmetry_spec(a, x)
    sd_a, sd_b = a.state_dict(), b.state_dict()
    unbound = [k for k, bs in spec.tensors.items() if not bs and sd_a[k].is_floating_point()]
    err = check_function_preserved(spec, a, (x,), seed=1, rtol=1e-5)
    g = spec.random_element(seed=0)
    planted = mc.weight_matching(spec, sd_a, spec.apply(sd_a, g), restarts=1, max_iter=5)
    recovered = spec.equal(planted.element, spec.inverse(g))
    wm = mc.weight_matching(spec, sd_a, sd_b, restarts=1, max_iter=5)
    aligned = spec.apply(sd_b, wm.element)
    data = TensorDataset(torch.randn(8, 3, size, size), torch.randint(0, 10, (8,)))
    loader = DataLoader(data, batch_size=4)
    mc.merge([sd_a, aligned], model=a, bn="reset", bn_loader=loader, spec=spec)
    repair = "ok"
    try:
        mc.merge([sd_a, aligned], model=a, bn="repair", bn_loader=loader, spec=spec)
    except mc.errors.ModeconnError as exc:
        repair = f"refused: {exc}"
    curve = mc.evaluate_path(a, sd_a, aligned, loader, lambdas=3, bn_loader=loader, spec=spec)
    return {"status": "supported" if not unbound[1:] and recovered else "partial", "spaces": len(spec.spaces),
            "unbound_float": unbound, "function_rel_err": err, "planted_recovered": recovered, "repair": repair,
            "path_points": len(curve.lambdas), "seconds": round(time.perf_counter() - t0, 1)}


def main(names: list[str]) -> None:
    torch.set_num_threads(1)
    results = {}
    for name in names:
        try:
            results[name] = check(name)
        except Exception as exc:  # a refusal is a result: recorded with its message
            results[name] = {"status": "refused", "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                             "where": traceback.format_exc(limit=1).splitlines()[-1][:200]}
        print(name, json.dumps(results[name])[:300], flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    if (OUT / "zoo.json").is_file():  # a partial run updates the rows it checked
        results = {**json.loads((OUT / "zoo.json").read_text())["models"], **results}
    versions = {"torch": torch.__version__}
    for lib in ("torchvision", "timm"):
        try:
            versions[lib] = __import__(lib).__version__
        except ImportError:
            pass
    (OUT / "zoo.json").write_text(json.dumps({"versions": versions, "models": results}, indent=2))
    rows = ["| model | status | spaces | function rel. err. | planted | REPAIR | note |", "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        if r["status"] == "refused":
            rows.append(f"| {name} | refused | | | | | {r['error'][:400]} |")
        else:
            note = "" if r["unbound_float"][1:] == [] else f"unbound: {r['unbound_float'][:4]}"
            rows.append(f"| {name} | {r['status']} | {r['spaces']} | {r['function_rel_err']:.1e} | "
                        f"{'exact' if r['planted_recovered'] else 'no'} | {r['repair'][:40]} | {note} |")
    n_ok = sum(r["status"] == "supported" for r in results.values())
    (OUT / "zoo.md").write_text(f"# Vision zoo ({', '.join(f'{k} {v}' for k, v in versions.items())})\n\n"
                                f"{n_ok} of {len(results)} fully supported.\n\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:] or TORCHVISION + TIMM)

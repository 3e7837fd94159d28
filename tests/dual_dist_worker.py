"""Run under ``torchrun`` by tests/test_dual_distributed.py (not collected: no ``test_`` prefix).

``torchrun --standalone --nproc_per_node N tests/dual_dist_worker.py OUT``: every rank runs data-parallel dual
matching on :func:`problem` (a tiny absorbed GPT-NeoX pair, global batches of 8, 8 and 5 rows: the last splits
unevenly) and writes ``OUT/rank{r}.safetensors`` (its learned elements, ``whole.a.<space>`` / ``whole.b.<space>``
for the uninterrupted run and ``resumed.*`` for the 4-step run resumed to :data:`STEPS`) and ``OUT/rank{r}.json``
(losses, λ, the steps at which this rank wrote a checkpoint, the errors three misuses raise). The same :func:`problem`
and :data:`OPTIONS` give the single-process reference in the test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from hf_tiny import make

STEPS = 10
#: dual_matching options shared by the distributed runs and the single-process reference
OPTIONS = {"lr": 0.02, "seed": 3, "checkpoint_every": 3}
FULL = {"residual": "orthogonal", "heads": "permutation", "qk": "head_invertible", "vo": "head_invertible",
        "ffn": "permutation"}


def problem() -> dict:
    """Spec, model, endpoints, weight-matching element and a loader of global batches of 8, 8 and 5 rows."""
    import modeconn as mc
    from modeconn.symmetry import hf

    torch.set_num_threads(1)
    ma = mc.absorb_normalization(make("gpt_neox", 0))
    mb = mc.absorb_normalization(make("gpt_neox", 1))
    spec = hf.hf_symmetry_spec(ma, groups=FULL)
    x = torch.randint(0, 50, (21, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = ma(x).logits.argmax(-1)
    loader = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 21, 8)]
    wm = mc.weight_matching(spec, ma.state_dict(), mb.state_dict(), seed=0, restarts=1, max_iter=3)
    return {"model": ma, "spec": spec, "a": ma.state_dict(), "b": mb.state_dict(), "loader": loader, "wm": wm}


def run(p: dict, steps: int, **options):
    from modeconn.match import dual_matching

    return dual_matching(p["spec"], p["model"], p["a"], p["b"], p["loader"], steps=steps, weight_alignment=p["wm"],
                         **OPTIONS, **options)


def errors(p: dict, rank: int) -> dict[str, str | None]:
    """The messages of the errors each misuse raises on this rank (None: no error)."""
    from modeconn.errors import ConfigError, DistributedError
    from modeconn.match.distributed import Ranks

    reordered = {**p, "loader": p["loader"] if rank == 0 else p["loader"][::-1]}
    one_row = {**p, "loader": [(x[:1], y[:1]) for x, y in p["loader"]]}
    cases = {
        "one_row": (ConfigError, lambda: run(one_row, 2)),  # world size 2 > 1 row per batch: before any work
        "other_order": (DistributedError, lambda: run(reordered, 1)),  # rank 1 sees other batches: at step 1
        "digest": (DistributedError, lambda: Ranks.resolve(None, None, torch.device("cpu")).check_same(
            "the test tensors", [torch.tensor([rank])])),  # tensors that must agree but do not
    }
    out = {}
    for name, (kind, call) in cases.items():
        try:
            call()
            out[name] = None
        except kind as e:
            out[name] = str(e)
    return out


def main(out: Path) -> None:
    from safetensors.torch import save_file

    from modeconn.match import dual

    info = dual.init_distributed(device="cpu")
    p = problem()
    writes = []
    save = dual._save_checkpoint
    dual._save_checkpoint = lambda path, state: (writes.append(state["step"]), save(path, state))  # count writes
    whole = run(p, STEPS, checkpoint_dir=out / "whole")
    run(p, 4, checkpoint_dir=out / "split")
    resumed = run(p, STEPS, checkpoint_dir=out / "split")
    tensors = {f"{name}.{side}.{s}": t for name, res in (("whole", whole), ("resumed", resumed))
               for side, el in res.export_transforms().items() for s, t in el.items()}
    save_file(tensors, str(out / f"rank{info.rank}.safetensors"))
    record = {"rank": info.rank, "world_size": info.world_size, "initialized_here": info.initialized_here,
              "losses": whole.history[0], "resumed_losses": resumed.history[0], "lambdas": whole.stats["lambdas"],
              "resumed_from": resumed.stats["resumed_from"], "stats_world_size": whole.stats["world_size"],
              "checkpoint_writes": writes, "errors": errors(p, info.rank)}
    (out / f"rank{info.rank}.json").write_text(json.dumps(record))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Run under ``torchrun`` by tests/test_dual_sharded.py (not collected: no ``test_`` prefix).

``torchrun --standalone --nproc_per_node N tests/dual_shard_worker.py OUT``: rank 0 writes the endpoints of
:func:`dual_dist_worker.problem` (a tiny absorbed GPT-NeoX pair) as safetensors checkpoints ``OUT/a``, ``OUT/b``; every
rank then runs sharded dual matching reading its rows from them, three times: as it is (``ok``), with every shard read
one row off (``broken``: entries rolled by one along the sharded axis within each rank's block), and with each rank's
share of a per-head element's gradient written at the element's first units instead of its own (``misplaced``: the
head-aligned blocks' backward into the transforms). Each rank writes ``OUT/rank{r}.safetensors`` (``ok.a.<space>``,
``ok.b.<space>``, ``broken.*``, ``misplaced.*``) and ``OUT/rank{r}.json`` (losses, λ, stored bytes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from dual_dist_worker import problem, run

STEPS = 6


def write_endpoints(p: dict, out: Path) -> tuple[Path, Path]:
    from safetensors.torch import save_file

    dirs = out / "a", out / "b"
    if torch.distributed.get_rank() == 0:
        for d, sd in zip(dirs, (p["a"], p["b"]), strict=True):
            d.mkdir()
            save_file({k: v.contiguous() for k, v in sd.items()}, str(d / "model.safetensors"))
    torch.distributed.barrier()
    return dirs


def broken_rows(reader, key: str, start: int, stop: int, dim: int = 0) -> torch.Tensor:
    """The entries of the block, each one position off along the sharded axis (rolled by one)."""
    t = _rows(reader, key, start, stop, dim)
    return torch.roll(t, 1, dim) if t.dim() and t.shape[dim] > 1 else t


def misplaced_gradient(grad, like, units):
    """:func:`~modeconn.match.sharded.element_gradient` with the rank's units' gradient at the first units."""
    from modeconn.match.sharded import element_gradient

    return element_gradient(grad, like, None if units is None else (0, units[1] - units[0]))


def main(out: Path) -> None:
    from safetensors.torch import save_file

    from modeconn.match import dual, sharded

    info = dual.init_distributed(device="cpu")
    p = problem()
    a, b = write_endpoints(p, out)
    results = {"ok": run({**p, "a": str(a), "b": str(b)}, STEPS, shard=True)}
    sharded.RowReader.rows = broken_rows
    results["broken"] = run({**p, "a": str(a), "b": str(b)}, STEPS, shard=True)
    sharded.RowReader.rows = _rows
    dual.element_gradient, right = misplaced_gradient, dual.element_gradient
    results["misplaced"] = run({**p, "a": str(a), "b": str(b)}, STEPS, shard=True)
    dual.element_gradient = right
    tensors = {f"{name}.{side}.{s}": t for name, res in results.items()
               for side, el in res.export_transforms().items() for s, t in el.items()}
    save_file(tensors, str(out / f"rank{info.rank}.safetensors"))
    ok = results["ok"]
    record = {"rank": info.rank, "world_size": info.world_size, "losses": ok.history[0], "lambdas": ok.stats["lambdas"],
              "stats_world_size": ok.stats["world_size"], "sharded": ok.stats["sharded"],
              "stored_bytes": ok.stats["stored_bytes"], "broken_losses": results["broken"].history[0]}
    (out / f"rank{info.rank}.json").write_text(json.dumps(record))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    from modeconn.match.sharded import RowReader

    _rows = RowReader.rows
    main(Path(sys.argv[1]))

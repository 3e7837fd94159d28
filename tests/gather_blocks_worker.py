"""Run under ``torchrun`` by tests/test_dual_sharded.py (not collected: no ``test_`` prefix).

``torchrun --standalone --nproc_per_node N tests/gather_blocks_worker.py OUT``: every rank holds its
:func:`~modeconn.match.sharded.row_block` block, along axis 0 and along axis 1, of a seeded 7 × 5 tensor ``X`` (uneven
blocks; on 4 processes the last column block is empty), gathers it and takes a loss of its own (``Σ tanh(X·s)·w_r``,
``w_r`` seeded by the rank), the ranks' losses summing to the global one. Each rank writes ``OUT/rank{r}.json``: the
max |Δ| between its block's gradient and its block of the single-process gradient of the global loss, for
:func:`~modeconn.match.sharded.gather_blocks` (``ok``) and for ``DTensor.full_tensor`` (``full_tensor``, whose backward
keeps the local block of the rank's own gradient), and the max |Δ| of the gathered values.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def weights(rank: int) -> torch.Tensor:
    return torch.randn(7, 5, generator=torch.Generator().manual_seed(100 + rank), dtype=torch.float64)


def loss(x: torch.Tensor, rank: int) -> torch.Tensor:
    return (torch.tanh(x * 1.5) * weights(rank)).sum()


def main(out: Path) -> None:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    from modeconn.match import dual
    from modeconn.match.sharded import gather_blocks, row_block

    info = dual.init_distributed(device="cpu")
    rank, world = info.rank, info.world_size
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ref = x.clone().requires_grad_()
    sum(loss(ref, r) for r in range(world)).backward()  # one process: the global loss's gradient
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    record: dict = {"world": world}
    for dim in (0, 1):
        start, stop = row_block(x.shape[dim], rank, world)
        want = ref.grad.narrow(dim, start, stop - start)
        for name in ("ok", "full_tensor"):
            block = x.narrow(dim, start, stop - start).clone().requires_grad_()
            if name == "ok":
                whole = gather_blocks(block, dim, x.shape[dim])
            else:
                whole = DTensor.from_local(block, mesh, [Shard(dim)], shape=x.shape, stride=x.stride()).full_tensor()
            loss(whole, rank).backward()
            got = block.grad if block.grad is not None else torch.zeros_like(block)
            record[f"{name}.dim{dim}.grad"] = float((got - want).abs().max()) if got.numel() else 0.0
            record[f"{name}.dim{dim}.value"] = float((whole.detach() - x).abs().max())
            record[f"{name}.dim{dim}.rows"] = stop - start
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

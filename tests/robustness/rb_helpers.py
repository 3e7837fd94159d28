"""Small helpers shared by the robustness modules (architectures come from ``tests/archs.py``)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn


def logits(model: nn.Module, sd, x: torch.Tensor) -> torch.Tensor:
    """Eval-mode output of a private copy of ``model`` loaded with ``sd``."""
    m = copy.deepcopy(model)
    m.load_state_dict(sd)
    with torch.no_grad():
        return m.eval()(x)


def assert_same_function(model: nn.Module, sd_1, sd_2, x: torch.Tensor, tol: float = 1e-5) -> None:
    """AssertionError unless ``sd_1`` and ``sd_2`` give the same logits on ``x`` (float32 tolerance)."""
    y1, y2 = logits(model, sd_1, x), logits(model, sd_2, x)
    scale = 1.0 + float(y1.abs().max())
    err = float((y1 - y2).abs().max())
    assert err <= tol * scale, f"function changed: max |Δlogit| = {err:.3g} (scale {scale:.3g})"


def recovered(spec, res, g) -> bool:
    """Whether alignment ``res`` undoes the planted element ``g`` exactly."""
    return spec.equal(spec.compose(res.element, g), spec.identity())


def batches(in_shape, n: int = 3, bs: int = 16, seed: int = 0, classes: int = 5):
    """A list of ``n`` (x, y) batches of standard-normal inputs."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(bs, *in_shape, generator=g), torch.randint(0, classes, (bs,), generator=g)) for _ in range(n)]


class ResMLP(nn.Module):
    """``inp → blocks × (h ← h + fc2(relu(fc1(h)))) → out``: one residual stream plus one hidden space per block."""

    def __init__(self, width: int = 32, blocks: int = 8, hidden: int | None = None, in_features: int = 10):
        super().__init__()
        hidden = hidden or width
        self.inp = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, width)) for _ in range(blocks)
        )
        self.out = nn.Linear(width, 3)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = h + b(h)
        return self.out(h)


def res_mlp(seed: int, **kwargs) -> ResMLP:
    """A :class:`ResMLP` initialised from ``seed`` (the global RNG is left untouched)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return ResMLP(**kwargs).eval()


# ---------------------------------------------------------------- random architectures (fuzzing, class 4)
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "leaky": lambda: nn.LeakyReLU(0.1)}
NORMS = ("none", "batchnorm", "layernorm", "groupnorm")


@dataclass(frozen=True)
class Arch:
    conv: bool
    residual: bool
    widths: tuple[int, ...]  # plain: one per layer; residual: stream width per block (a change → projection shortcut)
    hidden: tuple[int, ...]  # residual: inner width per block
    norm: str
    bias: bool
    activation: str
    kernel: int
    flatten_head: bool
    seed: int


class RandomNet(nn.Module):
    """The network an :class:`Arch` describes (input (N, 2, 4, 4) for CNNs, (N, 6) for MLPs; 3 logits)."""

    def __init__(self, arch: Arch):
        super().__init__()
        self.arch = arch
        c_in = 2 if arch.conv else 6
        self.stem = self._writer(c_in, arch.widths[0])
        self.stem_norm = self._norm(arch.widths[0])
        self.act = ACTIVATIONS[arch.activation]()
        self.blocks = nn.ModuleList()
        prev = arch.widths[0]
        for i, w in enumerate(arch.widths):
            block = nn.Module()
            if arch.residual:
                h = arch.hidden[i]
                block.fc1, block.norm1, block.fc2, block.norm2 = self._writer(prev, h), self._norm(h), self._writer(h, w), self._norm(w)
                block.shortcut = nn.Sequential(self._writer(prev, w, kernel=1), self._norm(w)) if w != prev else nn.Identity()
            else:
                block.fc1, block.norm1 = self._writer(prev, w), self._norm(w)
            self.blocks.append(block)
            prev = w
        feat = prev * 16 if arch.conv and arch.flatten_head else prev
        self.head = nn.Linear(feat, 3)

    def _writer(self, n_in, n_out, kernel=None):
        if self.arch.conv:
            k = kernel or self.arch.kernel
            return nn.Conv2d(n_in, n_out, k, padding=k // 2, bias=self.arch.bias)
        return nn.Linear(n_in, n_out, bias=self.arch.bias)

    def _norm(self, n):
        kind = self.arch.norm
        if kind == "batchnorm":
            return nn.BatchNorm2d(n) if self.arch.conv else nn.BatchNorm1d(n)
        if kind == "layernorm":
            return nn.GroupNorm(1, n) if self.arch.conv else nn.LayerNorm(n)
        if kind == "groupnorm":
            return nn.GroupNorm(n, n)  # one group per channel: channel-wise, permutation-equivariant
        return nn.Identity()

    def forward(self, x):
        h = self.act(self.stem_norm(self.stem(x)))
        for b in self.blocks:
            if self.arch.residual:
                h = self.act(b.norm2(b.fc2(self.act(b.norm1(b.fc1(h))))) + b.shortcut(h))
            else:
                h = self.act(b.norm1(b.fc1(h)))
        if self.arch.conv:
            h = h.flatten(1) if self.arch.flatten_head else h.mean((2, 3))
        return self.head(h)


def build(arch: Arch) -> tuple[nn.Module, torch.Tensor]:
    with torch.random.fork_rng():
        torch.manual_seed(arch.seed)
        model = RandomNet(arch)
        with torch.no_grad():
            for m in model.modules():  # non-trivial affines and statistics: forgetting one must show
                if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)):
                    m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape))
                    m.bias.copy_(0.3 * torch.randn(m.bias.shape))
                if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                    m.running_mean.copy_(0.3 * torch.randn(m.running_mean.shape))
                    m.running_var.copy_(0.5 + torch.rand(m.running_var.shape))
        x = torch.randn(5, *((2, 4, 4) if arch.conv else (6,)))
    return model.eval(), x

"""Core-torch replicas of torchvision layer patterns (tests of the tracer's zoo rules that run without torchvision):
a torchvision-style ViT (nn.MultiheadAttention, class token cat, ``x[:, 0]``, ``torch._assert`` on sizes), a
ResNeXt block (grouped convolution), attention through ``F.scaled_dot_product_attention`` with per-head reshapes,
and an fx-wrapped elementwise op (stochastic depth)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


@torch.fx.wrap
def drop_rows(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """torchvision.ops.stochastic_depth's shape: a per-sample Bernoulli scale in training, the identity in eval."""
    if not training or p == 0.0:
        return x
    keep = torch.empty((x.shape[0],) + (1,) * (x.ndim - 1), device=x.device).bernoulli_(1 - p)
    return x * keep / (1 - p)


class EncoderBlock(nn.Module):
    def __init__(self, heads: int, dim: int, mlp: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.self_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        torch._assert(inp.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {inp.shape}")
        x = self.ln_1(inp)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = x + inp
        return x + drop_rows(self.mlp(self.ln_2(x)), 0.1, self.training)


class ViT(nn.Module):
    def __init__(self, image: int = 8, patch: int = 4, dim: int = 16, heads: int = 4, mlp: int = 32, layers: int = 2,
                 classes: int = 5) -> None:
        super().__init__()
        self.image_size, self.patch_size, self.hidden_dim = image, patch, dim
        self.conv_proj = nn.Conv2d(3, dim, patch, patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.layers = nn.Sequential(*[EncoderBlock(heads, dim, mlp) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.heads = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        torch._assert(h == self.image_size, f"Wrong image height! Expected {self.image_size} but got {h}!")
        x = self.conv_proj(x).reshape(n, self.hidden_dim, (h // self.patch_size) * (w // self.patch_size))
        x = torch.cat([self.class_token.expand(n, -1, -1), x.permute(0, 2, 1)], dim=1)
        x = self.ln(self.layers(x + self.pos_embedding))
        return self.heads(x[:, 0])


class ResNeXt(nn.Module):
    def __init__(self, width: int = 16, groups: int = 4, classes: int = 5) -> None:
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
        self.conv1, self.bn1 = nn.Conv2d(width, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, width, 1, bias=False), nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn0(self.stem(x)))
        o = torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))
        return self.fc(torch.relu(self.bn3(self.conv3(o)) + x).mean((2, 3)))


class SDPAttention(nn.Module):
    """Separate q/k/v projections, per-head reshape, ``F.scaled_dot_product_attention``, heads merged, projected."""

    def __init__(self, dim: int = 16, heads: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Linear(6, dim)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        b, t, d = h.shape
        q, k, v = (f(h).unflatten(-1, (self.heads, d // self.heads)).transpose(1, 2) for f in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        return self.head((h + self.o(a)).mean(1))


class BatchNormAct2d(nn.BatchNorm2d):
    """timm's BatchNormAct2d: ``F.batch_norm`` then an activation, inside a BatchNorm2d subclass's own forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                         self.training, 0.1 if self.momentum is None else self.momentum, self.eps)
        return torch.relu(x)


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps).permute(0, 3, 1, 2)


class ConvNeXtLike(nn.Module):
    """timm ConvNeXt's block: depthwise conv, channels-last norm, MLP, layer scale read through ``gamma.reshape``."""

    def __init__(self, dim: int = 8, classes: int = 4) -> None:
        super().__init__()
        self.stem, self.stem_norm = nn.Conv2d(3, dim, 2, 2), LayerNorm2d(dim)
        self.conv_dw, self.norm = nn.Conv2d(dim, dim, 3, padding=1, groups=dim), LayerNorm2d(dim)
        self.fc1, self.fc2 = nn.Conv2d(dim, 2 * dim, 1), nn.Conv2d(2 * dim, dim, 1)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))
        self.bn = BatchNormAct2d(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem_norm(self.stem(x))
        y = self.fc2(F.gelu(self.fc1(self.norm(self.conv_dw(x)))))
        x = x + y.mul(self.gamma.reshape(1, -1, 1, 1))
        return self.head(self.bn(x).mean((2, 3)))


class MixerBlock(nn.Module):
    """MLP-Mixer: token mixing by Linear layers over the token dim (transposed), channel mixing over features."""

    def __init__(self, tokens: int = 4, d: int = 6):
        super().__init__()
        self.stem, self.norm1, self.norm2 = nn.Conv2d(3, d, 4, stride=4), nn.LayerNorm(d), nn.LayerNorm(d)
        self.tok1, self.tok2 = nn.Linear(tokens, 5), nn.Linear(5, tokens)
        self.ch1, self.ch2, self.head = nn.Linear(d, 7), nn.Linear(7, d), nn.Linear(d, 3)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = x + self.tok2(torch.relu(self.tok1(self.norm1(x).transpose(1, 2)))).transpose(1, 2)
        x = x + self.ch2(torch.relu(self.ch1(self.norm2(x))))
        return self.head(x.mean(1))


class SplitScales(nn.Module):
    """Res2Net-style: split channels into equal scales, a conv per scale fed by the previous one, concatenated;
    then GhostNet-style: two convs concatenated and sliced back to the first's width plus part of the second."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.convs = nn.ModuleList(nn.Conv2d(2, 2, 3, padding=1) for _ in range(3))
        self.primary, self.cheap = nn.Conv2d(8, 4, 1), nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.up, self.head = nn.Upsample(scale_factor=2), nn.Linear(4, 3)

    def forward(self, x):
        spx = torch.split(self.stem(x), 2, 1)
        out, sp = [spx[0]], spx[0]
        for i, conv in enumerate(self.convs):
            sp = torch.relu(conv(sp + spx[i + 1] if i else spx[i + 1]))
            out.append(sp)
        p = self.primary(torch.cat(out, 1))
        y = torch.cat([p, self.cheap(p)], 1)[:, :4]
        return self.head(self.up(y).mean((2, 3)))


class DualPath(nn.Module):
    """DPN-style: one convolution's output sliced into a residual part and a dense part of different widths."""

    def __init__(self):
        super().__init__()
        self.stem, self.c1 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 6, 1)
        self.c2, self.head = nn.Conv2d(4, 4, 3, padding=1), nn.Linear(6, 3)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        s = self.c1(x)
        resid, dense = s[:, :4], s[:, 4:]
        y = torch.cat([resid + torch.relu(self.c2(x)), dense], dim=1)
        return self.head(y.mean((2, 3)))


class SplitAttention(nn.Module):
    """ResNeSt's split attention: a conv writes ``radix`` groups of channels (reshaped to a radix axis), summed over
    the radix for the gate; the gate's radix softmax mixes the radix groups channel by channel."""

    def __init__(self, c: int = 4, radix: int = 2):
        super().__init__()
        self.radix, self.stem = radix, nn.Conv2d(3, c, 3, padding=1)
        self.conv, self.fc1, self.fc2 = nn.Conv2d(c, c * radix, 3, padding=1), nn.Conv2d(c, 6, 1), nn.Conv2d(6, c * radix, 1)
        self.head = nn.Linear(c, 3)

    def forward(self, x):
        x = torch.relu(self.conv(torch.relu(self.stem(x))))
        b, rc, h, w = x.shape
        x = x.reshape(b, self.radix, rc // self.radix, h, w)
        gap = torch.relu(self.fc1(x.sum(dim=1).mean((2, 3), keepdim=True)))
        attn = self.fc2(gap).view(b, 1, self.radix, -1).transpose(1, 2).softmax(dim=1).reshape(b, -1)
        out = (x * attn.reshape(b, self.radix, rc // self.radix, 1, 1)).sum(dim=1)
        return self.head(out.mean((2, 3)))


class GhostResidual(nn.Module):
    """GhostNet: a module's output is [primary conv, cheap conv of it] concatenated, added to a one-space shortcut."""

    def __init__(self):
        super().__init__()
        self.stem, self.primary = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 4, 1)
        self.cheap, self.head = nn.Conv2d(4, 2, 3, padding=1), nn.Linear(6, 3)

    def forward(self, x):
        s = torch.relu(self.stem(x))
        p = self.primary(s)
        return self.head((torch.cat([p, self.cheap(p)], 1) + s).mean((2, 3)))


class SharedAndPadded(nn.Module):
    """One depthwise conv called twice (CoaT's shared positional conv), spatial ``F.pad``, StarReLU's ``relu(x) ** 2``,
    and ``torch.split`` into unequal pieces along the channels."""

    def __init__(self):
        super().__init__()
        self.stem, self.cpe = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.a, self.b, self.head = nn.Conv2d(2, 2, 1), nn.Conv2d(4, 4, 1), nn.Linear(6, 3)

    def forward(self, x):
        h = self.stem(x)
        h = h + self.cpe(h)
        h = torch.nn.functional.pad(torch.relu(h) ** 2, (1, 1, 1, 1))
        h = h + self.cpe(h)
        p, q = torch.split(h, [2, 4], 1)
        return self.head(torch.cat([self.a(p), self.b(q)], 1).mean((2, 3)))


class WindowBlock(nn.Module):
    """timm Swin's data movement: channels-last tokens, a cyclic shift (``roll``), window partition and reverse by
    reshapes that keep the channel dim whole, and patch merging ``(…, 2, 2, C) → 4C`` by permute + flatten."""

    def __init__(self, c: int = 4):
        super().__init__()
        self.embed, self.mlp = nn.Conv2d(3, c, 2, stride=2), nn.Linear(c, c)
        self.norm, self.reduce, self.head = nn.LayerNorm(4 * c), nn.Linear(4 * c, 2 * c, bias=False), nn.Linear(2 * c, 3)

    def forward(self, x):
        h = self.embed(x).permute(0, 2, 3, 1)  # (B, 4, 4, C)
        b, hh, ww, c = h.shape
        w = torch.roll(h, shifts=(-1, -1), dims=(1, 2)).view(b, hh // 2, 2, ww // 2, 2, c)
        w = self.mlp(w.permute(0, 1, 3, 2, 4, 5).reshape(-1, 4, c))
        h = h + torch.roll(w.view(b, hh // 2, ww // 2, 2, 2, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hh, ww, c),
                           shifts=(1, 1), dims=(1, 2))
        m = h.reshape(b, hh // 2, 2, ww // 2, 2, c).permute(0, 1, 3, 4, 2, 5).flatten(3)
        return self.head(self.reduce(self.norm(m)).mean((1, 2)))

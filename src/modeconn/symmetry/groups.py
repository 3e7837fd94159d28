"""Groups that act on a space, and how one element acts on one tensor axis.

A *space* of size ``n`` is a hidden dimension of a network (units of a layer, channels, a residual
stream, the heads of an attention layer). A group element ``g`` acts on activations ``h`` living in that
space as ``h' = M_g h``. To keep the network's function, every tensor axis that *writes* the space (output
side, e.g. rows of a Linear weight, a bias, BatchNorm statistics) is transformed by ``M_g`` and every axis
that *reads* it (input side, e.g. columns of the next Linear weight) by ``M_g^{-1}`` from the right, i.e.
along that axis the vector transforms by ``M_g^{-T}`` (METHODS.md §0). For permutations and rotations
``M_g^{-T} = M_g``, so both sides reduce to the same operation.

A bound axis range has ``n·block`` entries: ``block`` consecutive entries form one *unit* (conv → flatten:
``block = H·W``; heads: ``block = head_dim``). A group acts on units; what it does inside a unit depends on
the group:

=================== ============================== =============================================================
group (params)      element                        ``M_g`` on an axis of ``n`` units of ``block`` entries
=================== ============================== =============================================================
``permutation``     LongTensor ``(n,)`` ``perm``    ``(M h)_i = h_{perm[i]}`` (index gather; exact in every dtype)
``orthogonal``      float ``(n, n)`` ``Q``          ``Q ⊗ I_block``; ``QᵀQ = I`` (the global residual rotation)
``invertible``      float ``(n, n)`` ``A``          ``A ⊗ I_block``; ``A`` invertible (GL(n))
``scaling``         float ``(n,)`` ``s > 0``        ``diag(s) ⊗ I_block`` (ReLU units, the linear branch of a GLU)
``head_orthogonal`` float ``(n, d, d)`` ``C``       ``blockdiag(C_0 … C_{n-1})``, each ``C_i ∈ O(d)``; ``block = d``
 (dim=d, rotary_dims, rotary_pairing)
``head_invertible`` float ``(n, d, d)`` ``C``       ``blockdiag(C_0 … C_{n-1})``, each ``C_i ∈ GL(d)``; ``block = d``
 (dim=d, rotary_dims, rotary_pairing)
=================== ============================== =============================================================

``head_*`` groups: one ``d × d`` transform per attention head (the per-head QK circuit
``W_Q^h → A W_Q^h, W_K^h → A^{-T} W_K^h`` — q rows bound on the output side, k rows on the input side — and
the OV circuit ``W_V^h → B W_V^h, W_O^h → W_O^h B^{-1}`` — v rows output side, o_proj columns input side;
METHODS.md §0/§3, Theus et al. 2025.) With ``rotary_dims = r > 0`` the first ``r`` dims of every head are
rotated by rotary embeddings (RoPE): the score ``(R_m q)ᵀ(R_n k)`` becomes ``qᵀAᵀR_mᵀR_n A^{-T}k``, unchanged
at all positions iff ``A`` commutes with every RoPE rotation, i.e. (for distinct RoPE frequencies) on each
rotated pair ``(p, q)`` it is a scaled rotation ``[[a, -b], [b, a]]`` (``a² + b² = 1`` for
``head_orthogonal``), no entry couples different pairs or a
rotary dim with a non-rotary one, and the remaining ``d − r`` dims (partial rotary, GPT-NeoX
``rotary_pct``) carry an unrestricted ``O(d−r)`` / ``GL(d−r)`` block. Pairs: ``rotary_pairing="half"``
(GPT-NeoX / Llama / HF ``rotate_half``: ``(i, i + r/2)``, ``i < r/2``) or ``"interleaved"`` (GPT-J:
``(2i, 2i+1)``).

*Head permutations with per-head transforms (a wreath product).* Heads move as whole blocks under a
``permutation`` space of size ``H`` (bindings with ``block = head_dim``, or ``3·head_dim`` on a fused qkv
axis) and each head carries its own QK and OV transform: ``head_*`` spaces declared with ``parent=`` the
head-permutation space (:class:`~modeconn.symmetry.spec.Space`). The combined element is
``M = D_C · P_perm`` — heads are moved first, then unit ``i`` of the result is transformed by ``C[i]``
(``C`` is indexed by the *new* position). The same construction gives FFN permutation + per-unit scaling
(``scaling`` space with the FFN permutation as parent). Composition and inversion then mix the spaces:
``(π, C)∘(σ, E) = (σ[π], C·E[π])`` (``σ[π]`` is ``permutation.compose(π, σ)``; ``C·E[π]`` multiplies unit by
unit) and ``(π, C)^{-1} = (π^{-1}, C^{-1}[π^{-1}])``; the spec does that with :meth:`Group.permute_units`.
Groups allowed as children are the *unit-wise* ones (``scaling``, ``head_*``).

Numerics: continuous groups compute in fp32 (fp64 if the tensor is fp64) and cast back to the tensor's
dtype once; bf16/fp16 storage is never used for arithmetic. Elements are fp32 (``random``, ``identity``,
matching results) or fp64 tensors; group operations on them run in fp64 and return the elements' dtype.
``equal`` of continuous elements is ``allclose`` with ``rtol = 1e-4`` and ``atol = 1e-4·max(1, max|h|)``.
``check`` raises :class:`~modeconn.errors.SpecError` naming the space for a wrong dtype/shape, NaN/Inf, a
non-orthogonal matrix (``max|QᵀQ − I| > 1e-3``), a singular one (1-norm condition number above ``1e7``,
i.e. numerically singular in fp32), a non-positive scale, or a head transform that does not commute with
RoPE (deviation from the pair structure above ``1e-4·max(1, max|C|)``).

New groups subclass :class:`Group` and register in :data:`GROUPS` (``get_group(name, **params)``); the
spec and the application code are group-agnostic.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Literal

import torch

from ..errors import SpecError
from ..registry import Registry

Side = Literal["out", "in"]

GROUPS: Registry[type["Group"]] = Registry("group")

EQUAL_RTOL = 1e-4
EQUAL_ATOL = 1e-4
ORTHOGONAL_TOL = 1e-3
MAX_CONDITION = 1e7
STRUCTURE_TOL = 1e-4
_LOG2 = math.log(2.0)


class Group(ABC):
    """A family of groups indexed by the space size ``n``; elements are tensors.

    Class flags used by the spec and by weight matching: ``exact`` (applied by index gathering, no
    arithmetic, so no dtype promotion), ``isometric`` (every element preserves Frobenius norms of the tensors
    it acts on: permutations, orthogonal groups), ``unitwise`` (an element is one entry per unit along
    dim 0, so a parent permutation can reorder it: :meth:`permute_units`; only such groups can be children).
    """

    name: str
    exact: bool = True
    isometric: bool = True
    unitwise: bool = False

    @abstractmethod
    def identity(self, n: int) -> torch.Tensor:
        """The neutral element of the group acting on a space of size ``n``."""

    @abstractmethod
    def random(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """A random element drawn with ``generator`` (same seed → same element)."""

    @abstractmethod
    def compose(self, g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``g∘h``: acting with the result equals acting with ``h`` first, then ``g``."""

    @abstractmethod
    def inverse(self, g: torch.Tensor) -> torch.Tensor:
        """``g^{-1}``."""

    @abstractmethod
    def check(self, g: torch.Tensor, n: int, space: str) -> None:
        """Raise :class:`SpecError` naming ``space`` unless ``g`` is a valid element for size ``n``."""

    @abstractmethod
    def equal(self, g: torch.Tensor, h: torch.Tensor) -> bool:
        """Whether two elements are the same (exactly for discrete groups)."""

    @abstractmethod
    def act(
        self, t: torch.Tensor, axis: int, g: torch.Tensor, side: Side, block: int, cache: dict | None = None
    ) -> torch.Tensor:
        """Act on axis ``axis`` of ``t`` whose size is ``n * block`` (``block`` consecutive entries per unit).

        ``side="out"``: the axis writes the space; ``side="in"``: it reads it. Returns a new tensor.
        ``cache``: an optional dict, valid for one call of ``spec.apply``, where derived matrices (inverses)
        may be kept between tensors.
        """

    def permute_units(self, g: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        """``g`` with its units reordered, ``g'[i] = g[perm[i]]`` (unit-wise groups only)."""
        raise SpecError(f"group {self.name!r} is not unit-wise; it cannot be the child of a permutation")


@GROUPS.register("permutation")
class PermutationGroup(Group):
    """The symmetric group S_n. An element is a LongTensor ``perm`` of shape (n,): unit ``i`` of the new
    parameters is unit ``perm[i]`` of the old ones (``h'_i = h_{perm[i]}``). Applied by index gathering,
    never by a dense matmul, so it is exact in every dtype."""

    name = "permutation"

    def identity(self, n: int) -> torch.Tensor:
        return torch.arange(n)

    def random(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randperm(n, generator=generator)

    def compose(self, g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        # (h·θ)[i] = θ[h[i]];  (g·(h·θ))[i] = (h·θ)[g[i]] = θ[h[g[i]]]
        return h[g.to(h.device)]

    def inverse(self, g: torch.Tensor) -> torch.Tensor:
        return torch.argsort(g)

    def check(self, g: torch.Tensor, n: int, space: str) -> None:
        if not isinstance(g, torch.Tensor) or g.dtype not in (torch.int64, torch.int32) or g.shape != (n,):
            shape = tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
            raise SpecError(f"space {space!r}: a permutation must be an integer tensor of shape ({n},), got {shape}")
        if not torch.equal(torch.sort(g.cpu()).values, torch.arange(n, dtype=g.dtype)):
            raise SpecError(f"space {space!r}: element is not a permutation of 0..{n - 1}")

    def equal(self, g: torch.Tensor, h: torch.Tensor) -> bool:
        return torch.equal(g.cpu(), h.cpu())

    def act(self, t, axis, g, side, block, cache=None):
        g = g.to(t.device)
        if block > 1:
            g = (g[:, None] * block + torch.arange(block, device=t.device)).reshape(-1)
        return t.index_select(axis, g)


# ---------------------------------------------------------------------------------------------- helpers
def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype continuous groups compute in for a tensor stored as ``dtype``: fp64 stays fp64, else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _float_element(g, shape: tuple[int, ...], space: str, what: str) -> torch.Tensor:
    if not isinstance(g, torch.Tensor) or g.dtype not in (torch.float32, torch.float64) or tuple(g.shape) != shape:
        got = f"{g.dtype} tensor of shape {tuple(g.shape)}" if isinstance(g, torch.Tensor) else type(g).__name__
        raise SpecError(f"space {space!r}: {what} element must be a float32/float64 tensor of shape {shape}, got {got}")
    if not torch.isfinite(g).all():
        raise SpecError(f"space {space!r}: {what} element has NaN/Inf entries")
    return g.detach().to("cpu", torch.float64)


def _check_orthogonal(m: torch.Tensor, space: str, what: str) -> None:
    eye = torch.eye(m.shape[-1], dtype=m.dtype)
    dev = (m.transpose(-1, -2) @ m - eye).abs().amax(dim=(-1, -2)).reshape(-1)
    worst = int(dev.argmax())
    if dev[worst] > ORTHOGONAL_TOL:
        where = f" (head {worst})" if m.dim() == 3 else ""
        raise SpecError(f"space {space!r}: {what} element is not orthogonal{where}: max|QᵀQ − I| = {float(dev[worst]):.3g}")


def _check_invertible(m: torch.Tensor, space: str, what: str) -> None:
    inv, info = torch.linalg.inv_ex(m)
    cond = torch.linalg.matrix_norm(m, 1) * torch.linalg.matrix_norm(inv, 1)
    cond = torch.where(info.bool() | ~torch.isfinite(cond), torch.full_like(cond, math.inf), cond).reshape(-1)
    worst = int(cond.argmax())
    if not cond[worst] <= MAX_CONDITION:
        where = f" (head {worst})" if m.dim() == 3 else ""
        raise SpecError(
            f"space {space!r}: {what} element is singular{where} (1-norm condition number {float(cond[worst]):.3g} > {MAX_CONDITION:.0e})"
        )


def _haar(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Haar-random orthogonal matrices of shape ``(*batch, d, d)`` in fp64 (QR of a Gaussian, sign fix)."""
    z = torch.randn(*shape, generator=gen, dtype=torch.float64)
    if z.numel() == 0:
        return z
    q, r = torch.linalg.qr(z)
    d = torch.diagonal(r, dim1=-2, dim2=-1).sign()
    d = torch.where(d == 0, torch.ones_like(d), d)
    return q * d[..., None, :]


def _log_uniform(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """exp(U(−ln 2, ln 2)): factors in [1/2, 2], fp64."""
    return torch.exp((2 * torch.rand(*shape, generator=gen, dtype=torch.float64) - 1) * _LOG2)


def _well_conditioned(gen: torch.Generator, batch: tuple[int, ...], d: int) -> torch.Tensor:
    """Q·P with Q Haar-orthogonal and P SPD with eigenvalues in [1/2, 2] (condition number ≤ 4), fp64."""
    q = _haar(gen, *batch, d, d)
    u = _haar(gen, *batch, d, d)
    lam = _log_uniform(gen, *batch, d)
    return q @ (u * lam[..., None, :]) @ u.transpose(-1, -2)


def _allclose(g: torch.Tensor, h: torch.Tensor) -> bool:
    if g.shape != h.shape:
        return False
    g, h = g.detach().cpu().double(), h.detach().cpu().double()
    scale = max(1.0, float(h.abs().max())) if h.numel() else 1.0
    return bool(torch.allclose(g, h, rtol=EQUAL_RTOL, atol=EQUAL_ATOL * scale))


def _units(t: torch.Tensor, axis: int, n: int) -> tuple[torch.Tensor, torch.Size]:
    x = t.movedim(axis, 0)
    return x.reshape(n, -1), x.shape


def _side_cached(cache: dict | None, g: torch.Tensor, side: str, dtype, device, make) -> torch.Tensor:
    if cache is None:
        return make().to(device, dtype)
    key = (id(g), side, dtype, device)
    if key not in cache:
        cache[key] = (g, make().to(device, dtype))  # keep g alive so its id is not reused during the call
    return cache[key][1]


class _Continuous(Group):
    """Shared machinery of the matrix / diagonal groups: fp32 compute, cast back once."""

    exact = False

    @abstractmethod
    def _side_matrix(self, g: torch.Tensor, side: Side) -> torch.Tensor:
        """The matrix (stack, vector) applied along an axis on ``side``: ``M`` or ``M^{-T}`` (fp64)."""

    @abstractmethod
    def _apply(self, x: torch.Tensor, m: torch.Tensor, n: int) -> torch.Tensor:
        """``x`` (n, rest) with each unit transformed by ``m`` (the side matrix)."""

    def act(self, t, axis, g, side, block, cache=None):
        if not t.is_floating_point():
            raise SpecError(f"group {self.name!r} cannot act on a {t.dtype} tensor (only floating tensors)")
        dtype = t.dtype
        cd = compute_dtype(dtype)
        m = _side_cached(cache, g, side, cd, t.device, lambda: self._side_matrix(g, side))
        n = m.shape[0]
        x, shape = _units(t.to(cd), axis, n)
        y = self._apply(x, m, n)
        return y.reshape(shape).movedim(0, axis).to(dtype)

    def equal(self, g, h):
        return _allclose(g, h)


# ---------------------------------------------------------------------------------------------- full matrices
@GROUPS.register("orthogonal")
class OrthogonalGroup(_Continuous):
    """O(n): an element is an orthogonal ``(n, n)`` matrix ``Q``; ``M_g = Q`` on units (``Q ⊗ I_block`` on
    the entries). Both sides transform by ``Q`` (``Q^{-T} = Q``). Random: Haar (QR of a Gaussian, sign fix).
    Used for the global residual rotation once every LayerNorm is an RMSNorm without weight (METHODS §0)."""

    name = "orthogonal"

    def identity(self, n):
        return torch.eye(n)

    def random(self, n, generator):
        return _haar(generator, n, n).to(torch.float32)

    def compose(self, g, h):
        return (g.double() @ h.to(g.device).double()).to(g.dtype)

    def inverse(self, g):
        return g.transpose(0, 1).clone()

    def check(self, g, n, space):
        _check_orthogonal(_float_element(g, (n, n), space, "an orthogonal"), space, "an orthogonal")

    def _side_matrix(self, g, side):
        return g.double()

    def _apply(self, x, m, n):
        return m @ x


@GROUPS.register("invertible")
class InvertibleGroup(OrthogonalGroup):
    """GL(n): an element is an invertible ``(n, n)`` matrix ``A``; writers transform by ``A``, readers by
    ``A^{-T}`` (computed once per ``spec.apply`` call, in fp64). Random: ``Q·P``, ``Q`` Haar, ``P`` SPD with
    eigenvalues in [1/2, 2] (condition number ≤ 4) — the polar decomposition of METHODS §3."""

    name = "invertible"
    isometric = False

    def random(self, n, generator):
        return _well_conditioned(generator, (), n).to(torch.float32)

    def inverse(self, g):
        return torch.linalg.inv(g.double()).to(g.dtype)

    def check(self, g, n, space):
        _check_invertible(_float_element(g, (n, n), space, "an invertible"), space, "an invertible")

    def _side_matrix(self, g, side):
        return g.double() if side == "out" else torch.linalg.inv(g.double()).transpose(-1, -2)


# ---------------------------------------------------------------------------------------------- unit-wise
@GROUPS.register("scaling")
class ScalingGroup(_Continuous):
    """Positive diagonal scalings (R_{>0})^n: an element is a vector ``s`` of ``n`` positive scales; writers
    multiply unit ``i`` by ``s[i]``, readers divide by it. Valid where the activation is positively
    homogeneous (ReLU units, the linear branch of a GLU) or, without normalisation, on a residual stream.
    Random: log-uniform in [1/2, 2]."""

    name = "scaling"
    isometric = False
    unitwise = True

    def identity(self, n):
        return torch.ones(n)

    def random(self, n, generator):
        return _log_uniform(generator, n).to(torch.float32)

    def compose(self, g, h):
        return (g.double() * h.to(g.device).double()).to(g.dtype)

    def inverse(self, g):
        return (1.0 / g.double()).to(g.dtype)

    def check(self, g, n, space):
        v = _float_element(g, (n,), space, "a scaling")
        bad = (v <= 0).nonzero()
        if len(bad):
            i = int(bad[0])
            raise SpecError(f"space {space!r}: non-positive scale {float(v[i]):.3g} at unit {i} (scales must be > 0)")

    def permute_units(self, g, perm):
        return g[perm.to(g.device)]

    def _side_matrix(self, g, side):
        return g.double() if side == "out" else 1.0 / g.double()

    def _apply(self, x, m, n):
        return x * m[:, None]


class _HeadGroup(_Continuous):
    """One ``d × d`` transform per head; see the module docstring for the rotary restriction."""

    unitwise = True
    _inner: str

    def __init__(self, dim: int, rotary_dims: int = 0, rotary_pairing: str = "half") -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise SpecError(f"{self.name}: dim (the head dimension) must be a positive int, got {dim!r}")
        if isinstance(rotary_dims, bool) or not isinstance(rotary_dims, int) or not 0 <= rotary_dims <= dim or rotary_dims % 2:
            raise SpecError(f"{self.name}: rotary_dims must be an even int in [0, dim={dim}], got {rotary_dims!r}")
        if rotary_pairing not in ("half", "interleaved"):
            raise SpecError(f"{self.name}: rotary_pairing must be 'half' or 'interleaved', got {rotary_pairing!r}")
        self.dim, self.rotary_dims, self.rotary_pairing = dim, rotary_dims, rotary_pairing
        r = rotary_dims
        if rotary_pairing == "half":
            p, q = torch.arange(r // 2), torch.arange(r // 2) + r // 2
        else:
            p, q = torch.arange(0, r, 2), torch.arange(1, r, 2)
        self.pairs = (p, q)
        self.rest = torch.arange(r, dim)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim}, rotary_dims={self.rotary_dims}, rotary_pairing={self.rotary_pairing!r})"

    # -- structure
    def project(self, m: torch.Tensor) -> torch.Tensor:
        """The nearest (in the entry-wise least-squares sense) RoPE-commuting matrices: pair blocks averaged
        to ``[[a, -b], [b, a]]``, every other entry outside the pass-through block zeroed. Identity map when
        ``rotary_dims = 0``."""
        if not self.rotary_dims:
            return m
        p, q = self.pairs
        a = (m[..., p, p] + m[..., q, q]) / 2
        b = (m[..., q, p] - m[..., p, q]) / 2
        out = torch.zeros_like(m)
        out[..., p, p], out[..., q, q], out[..., q, p], out[..., p, q] = a, a, b, -b
        r = self.rotary_dims
        out[..., r:, r:] = m[..., r:, r:]
        return out

    def assemble(self, a: torch.Tensor, b: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
        """Matrices (…, d, d) from pair coefficients ``a, b`` (…, r/2) and the pass-through block (…, d−r, d−r)."""
        shape = rest.shape[:-2] if rest.dim() >= 2 else a.shape[:-1]
        out = torch.zeros(*shape, self.dim, self.dim, dtype=rest.dtype, device=rest.device)
        p, q = self.pairs
        out[..., p, p], out[..., q, q], out[..., q, p], out[..., p, q] = a, a, b, -b
        out[..., self.rotary_dims:, self.rotary_dims:] = rest
        return out

    # -- group
    def identity(self, n):
        return torch.eye(self.dim).expand(n, self.dim, self.dim).clone()

    def compose(self, g, h):
        return self.project(g.double() @ h.to(g.device).double()).to(g.dtype)

    def permute_units(self, g, perm):
        return g[perm.to(g.device)]

    def _shape_check(self, g, n, space) -> torch.Tensor:
        m = _float_element(g, (n, self.dim, self.dim), space, f"a {self.name} (dim={self.dim})")
        if self.rotary_dims:
            dev = (m - self.project(m)).abs().amax(dim=(-1, -2))
            tol = STRUCTURE_TOL * max(1.0, float(m.abs().max()))
            bad = (dev > tol).nonzero()
            if len(bad):
                h = int(bad[0])
                raise SpecError(
                    f"space {space!r}: head {h} transform does not commute with the rotary embedding "
                    f"(rotary_dims={self.rotary_dims}, pairing {self.rotary_pairing!r}; deviation {float(dev[h]):.3g})"
                )
        return m

    def _apply(self, x, m, n):
        return (m @ x.reshape(n, self.dim, -1)).reshape(n, -1)


@GROUPS.register("head_orthogonal")
class HeadOrthogonalGroup(_HeadGroup):
    """O(d)^n, one orthogonal ``d × d`` matrix per head (``rotary_dims``: rotations ``[[c, -s], [s, c]]`` on
    each rotary pair, ``O(d−r)`` on the rest). Element ``(n, d, d)``; both sides transform by ``C[i]``."""

    name = "head_orthogonal"

    def random(self, n, generator):
        r = self.rotary_dims
        phi = 2 * math.pi * torch.rand(n, r // 2, generator=generator, dtype=torch.float64)
        rest = _haar(generator, n, self.dim - r, self.dim - r)
        return self.assemble(torch.cos(phi), torch.sin(phi), rest).to(torch.float32)

    def inverse(self, g):
        return g.transpose(-1, -2).clone()

    def check(self, g, n, space):
        _check_orthogonal(self._shape_check(g, n, space), space, f"a {self.name}")

    def _side_matrix(self, g, side):
        return g.double()


@GROUPS.register("head_invertible")
class HeadInvertibleGroup(_HeadGroup):
    """GL(d)^n, one invertible ``d × d`` matrix per head (``rotary_dims``: scaled rotations on each rotary pair,
    ``GL(d−r)`` on the rest). Element ``(n, d, d)``; writers transform by ``C[i]``, readers by
    ``C[i]^{-T}``. Random: scaled rotations with scale in [1/2, 2] and uniform angle; ``Q·P`` blocks
    (condition number ≤ 4) elsewhere."""

    name = "head_invertible"
    isometric = False

    def random(self, n, generator):
        r = self.rotary_dims
        rho = _log_uniform(generator, n, r // 2)
        phi = 2 * math.pi * torch.rand(n, r // 2, generator=generator, dtype=torch.float64)
        rest = _well_conditioned(generator, (n,), self.dim - r)
        return self.assemble(rho * torch.cos(phi), rho * torch.sin(phi), rest).to(torch.float32)

    def inverse(self, g):
        return self.project(torch.linalg.inv(g.double())).to(g.dtype)

    def check(self, g, n, space):
        _check_invertible(self._shape_check(g, n, space), space, f"a {self.name}")

    def _side_matrix(self, g, side):
        return g.double() if side == "out" else self.project(torch.linalg.inv(g.double())).transpose(-1, -2)


def get_group(name: str, **params) -> Group:
    """The registered group called ``name`` built with ``params`` (ConfigError listing the valid names for an
    unknown name; SpecError for bad parameters, e.g. ``head_invertible`` without ``dim``)."""
    cls = GROUPS.get(name)
    try:
        return cls(**params)  # type: ignore[operator]
    except TypeError as e:
        raise SpecError(f"group {name!r}: bad parameters {params}: {e}") from None

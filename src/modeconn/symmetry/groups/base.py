"""The :class:`Group` interface, the :data:`GROUPS` registry and the numerics every group shares.

A registered group declares, next to its group operations, how weight matching solves one of its spaces
(``solver``: a :class:`~modeconn.symmetry.groups.solving.Solver`, :data:`~modeconn.symmetry.groups.solving.ASSIGNMENT`
for permutations, or ``None``) and how dual / learned matching parameterises its elements (``transform``: a
:class:`~modeconn.symmetry.groups.learning.GroupTransform` subclass, or ``None`` for discrete groups). Both must
be declared explicitly — ``None`` included — or registering the group raises :class:`SpecError`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from ...errors import SpecError
from ...registry import Registry

if TYPE_CHECKING:
    from .learning import GroupTransform
    from .solving import Assignment, Solver

Side = Literal["out", "in"]

EQUAL_RTOL = 1e-4
EQUAL_ATOL = 1e-4
ORTHOGONAL_TOL = 1e-3
MAX_CONDITION = 1e7
STRUCTURE_TOL = 1e-4
_LOG2 = math.log(2.0)

HOOKS = ("solver", "transform")
"""Class attributes every registered group declares (``None`` allowed, absence is an error)."""


class Group(ABC):
    """A family of groups indexed by the space size ``n``; elements are tensors.

    Class flags used by the spec and by weight matching: ``exact`` (elements are unit permutations applied by
    index gathering, no arithmetic, so no dtype promotion; only such groups can be parents), ``isometric``
    (every element preserves Frobenius norms of the tensors it acts on — permutations, orthogonal groups — so
    ``g^{-T} = g`` and both sides act alike), ``unitwise`` (an element is one entry per unit along dim 0, so a
    parent permutation can reorder it: :meth:`permute_units`; only such groups can be children), ``per_head``
    (one ``dim × dim`` transform per attention head: built with ``dim``/``rotary_dims``).

    Hooks (declared by every registered group, see the module docstring): ``solver`` and ``transform``.
    """

    name: ClassVar[str]
    exact: ClassVar[bool] = True
    isometric: ClassVar[bool] = True
    unitwise: ClassVar[bool] = False
    per_head: ClassVar[bool] = False
    solver: ClassVar[Solver | Assignment | None]
    transform: ClassVar[type[GroupTransform] | None]

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


class GroupRegistry(Registry[type[Group]]):
    """:class:`Registry` of group classes that refuses a class without its hooks or with a different ``name``."""

    def register(self, name: str) -> Callable[[type[Group]], type[Group]]:
        inner = super().register(name)

        def deco(cls: type[Group]) -> type[Group]:
            missing = [h for h in HOOKS if not hasattr(cls, h)]
            if missing:
                raise SpecError(
                    f"group {name!r} ({cls.__name__}) does not declare {missing}: every group names its weight-matching "
                    "solver and its learned parameterisation (None where it has none)"
                )
            if getattr(cls, "name", None) != name:
                raise SpecError(f"group class {cls.__name__} has name {getattr(cls, 'name', None)!r}, registered as {name!r}")
            return inner(cls)

        return deco


GROUPS: GroupRegistry = GroupRegistry("group")


def get_group(name: str, **params: Any) -> Group:
    """The registered group called ``name`` built with ``params`` (ConfigError listing the valid names for an
    unknown name; SpecError for bad parameters, e.g. ``head_invertible`` without ``dim``)."""
    cls = GROUPS.get(name)
    try:
        return cls(**params)
    except TypeError as e:
        raise SpecError(f"group {name!r}: bad parameters {params}: {e}") from None


# ---------------------------------------------------------------------------------------------- numerics
def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype continuous groups compute in for a tensor stored as ``dtype``: fp64 stays fp64, else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def float_element(g: Any, shape: tuple[int, ...], space: str, what: str) -> torch.Tensor:
    """``g`` as a CPU fp64 tensor after checking it is a finite float32/float64 tensor of ``shape`` (SpecError
    naming ``space`` otherwise)."""
    if not isinstance(g, torch.Tensor) or g.dtype not in (torch.float32, torch.float64) or tuple(g.shape) != shape:
        got = f"{g.dtype} tensor of shape {tuple(g.shape)}" if isinstance(g, torch.Tensor) else type(g).__name__
        raise SpecError(f"space {space!r}: {what} element must be a float32/float64 tensor of shape {shape}, got {got}")
    if not torch.isfinite(g).all():
        raise SpecError(f"space {space!r}: {what} element has NaN/Inf entries")
    return g.detach().to("cpu", torch.float64)


def check_orthogonal(m: torch.Tensor, space: str, what: str) -> None:
    """SpecError unless ``max|QᵀQ − I| ≤ 1e-3`` for every matrix of ``m`` ((n, n) or a stack per head)."""
    eye = torch.eye(m.shape[-1], dtype=m.dtype)
    dev = (m.transpose(-1, -2) @ m - eye).abs().amax(dim=(-1, -2)).reshape(-1)
    worst = int(dev.argmax())
    if dev[worst] > ORTHOGONAL_TOL:
        where = f" (head {worst})" if m.dim() == 3 else ""
        raise SpecError(f"space {space!r}: {what} element is not orthogonal{where}: max|QᵀQ − I| = {float(dev[worst]):.3g}")


def check_invertible(m: torch.Tensor, space: str, what: str) -> None:
    """SpecError unless every matrix of ``m`` has a 1-norm condition number ≤ :data:`MAX_CONDITION`."""
    inv, info = torch.linalg.inv_ex(m)
    cond = torch.linalg.matrix_norm(m, 1) * torch.linalg.matrix_norm(inv, 1)
    cond = torch.where(info.bool() | ~torch.isfinite(cond), torch.full_like(cond, math.inf), cond).reshape(-1)
    worst = int(cond.argmax())
    if not cond[worst] <= MAX_CONDITION:
        where = f" (head {worst})" if m.dim() == 3 else ""
        raise SpecError(
            f"space {space!r}: {what} element is singular{where} (1-norm condition number {float(cond[worst]):.3g} > {MAX_CONDITION:.0e})"
        )


def haar(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Haar-random orthogonal matrices of shape ``(*batch, d, d)`` in fp64 (QR of a Gaussian, sign fix)."""
    z = torch.randn(*shape, generator=gen, dtype=torch.float64)
    if z.numel() == 0:
        return z
    q, r = torch.linalg.qr(z)
    d = torch.diagonal(r, dim1=-2, dim2=-1).sign()
    d = torch.where(d == 0, torch.ones_like(d), d)
    return q * d[..., None, :]


def log_uniform(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """exp(U(−ln 2, ln 2)): factors in [1/2, 2], fp64."""
    return torch.exp((2 * torch.rand(*shape, generator=gen, dtype=torch.float64) - 1) * _LOG2)


def well_conditioned(gen: torch.Generator, batch: tuple[int, ...], d: int) -> torch.Tensor:
    """Q·P with Q Haar-orthogonal and P SPD with eigenvalues in [1/2, 2] (condition number ≤ 4), fp64."""
    q = haar(gen, *batch, d, d)
    u = haar(gen, *batch, d, d)
    lam = log_uniform(gen, *batch, d)
    return q @ (u * lam[..., None, :]) @ u.transpose(-1, -2)


def allclose(g: torch.Tensor, h: torch.Tensor) -> bool:
    """``equal`` of continuous elements: ``rtol = 1e-4``, ``atol = 1e-4·max(1, max|h|)`` (fp64, on the CPU)."""
    if g.shape != h.shape:
        return False
    g, h = g.detach().cpu().double(), h.detach().cpu().double()
    scale = max(1.0, float(h.abs().max())) if h.numel() else 1.0
    return bool(torch.allclose(g, h, rtol=EQUAL_RTOL, atol=EQUAL_ATOL * scale))


def matrix_identity(n: int) -> torch.Tensor:
    """The identity ``(n, n)`` fp32 matrix (the neutral element of the whole-space matrix groups)."""
    return torch.eye(n)


def matrix_compose(g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``g @ h`` computed in fp64, returned in ``g``'s dtype (whole-space matrix groups)."""
    return (g.double() @ h.to(g.device).double()).to(g.dtype)


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


class ContinuousGroup(Group):
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
        return allclose(g, h)

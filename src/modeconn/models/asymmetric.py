"""W-asymmetric layers: ``W_eff = F + D ⊙ W`` with fixed random offsets F and a fixed 0/1 mask D.

Method (docs/methods.md §1, "neuron identifiability"; reference code vuenc/neuron-identifiability): in every
row of a layer's weight (for a convolution: every output channel, over its ``in_channels/groups · kh · kw``
entries) ``num_fixed`` randomly chosen entries are *masked* (D = 0) and replaced by a fixed offset
F = σ_F · N(0, 1); everywhere else D = 1 and F = 0. Only W is trained; the gradient of a masked entry,
``D ⊙ ∂L/∂W_eff``, is exactly zero. σ_F = 0 gives the sparse "D only" network. Because each neuron gets
its own fixed offsets, permuting neurons no longer leaves the function unchanged: the permutation
symmetry is broken.

Conventions of this implementation:

* ``weight`` is the trained W (so :func:`modeconn.symmetry_spec` binds ``weight``/``bias`` as for a stock
  ``nn.Linear``/``nn.Conv2d``: the classes are subclasses). Its masked entries are set to +0.0 at
  construction; with ``D ⊙ W`` in the forward pass their gradient is exactly 0, so SGD (with momentum
  and weight decay) and Adam/AdamW leave them at exactly 0: ``weight`` always equals ``D ⊙ weight``.
* F and D are persistent buffers ``fixed_offsets`` and ``fixed_mask`` (listed in the class attribute
  ``fixed_buffers``), so checkpoints carry them. They are never trained and never permuted (the symmetry
  tracer leaves every buffer it does not recognise unbound), so a permutation of W is no longer a
  symmetry of the function. :func:`fixed_structure_keys` lists them and :func:`fixed_structure_digest`
  hashes them (sha256); :mod:`modeconn.io` records the digest in ``config.json`` and on load checks both
  the digest and that the buffers equal those regenerated from the recorded config.
* F and D are drawn from a CPU ``torch.Generator`` seeded with :func:`layer_seed` ``(mask_seed, key)``:
  sha256 of the mask seed and the layer's *key* (its qualified module name inside the model, e.g.
  ``"blocks.0.linear"``). Never Python's ``hash()`` and never the global RNG, so two processes building
  the same architecture with the same ``mask_seed`` get identical F, D bytes, while the trained W follows
  the model's own ``seed``. The random stream is: ``rand(out, fan_in)`` (argsort per row → the masked
  positions), then ``randn(out, fan_in)`` (the offsets); F does not depend on σ_F beyond the scale, so a
  σ_F sweep with one mask seed shares D and the direction of F.
* σ_F is an absolute scale (F entries have standard deviation σ_F, not scaled by the fan-in), as in the
  reference (which uses σ_F = 1 … 3 with W initialised at std ~ 1/sqrt(fan_in): the "center-dominated"
  regime F ≫ W). W keeps PyTorch's default initialisation of the parent class.
* How many entries per row: either ``num_fixed`` (an absolute count, the reference's parameter; must be
  < fan-in for every asymmetric layer) or ``density`` (a fraction in [0, 1); the count is
  ``floor(density · fan_in + 0.5)`` (half up), capped at ``fan_in - 1`` so every row keeps a trainable
  entry). Giving neither uses ``density = DEFAULT_DENSITY = 0.125`` (the reference's MLP: 64 of 512 hidden inputs;
  ResNet20 stage 3: 72 of 576), which adapts to layers of any fan-in. Giving both is an error.
* ``offsets="dense"`` draws F at *every* entry (masked or not), so ``W_eff = F + D ⊙ W`` is the general form of
  the seed paper. With ``density=0`` (D = 1) and a weight decay on W this is "syre" (Ziyin et al. 2024/2025,
  "Remove Symmetries to Control Model Expressivity and Improve Optimization", Eq. 6: minimise
  ``L(θ + θ₀) + γ‖θ‖²`` with a fixed random θ₀): the stored W is θ, F is θ₀, and decoupled weight decay on W
  pulls ``W_eff`` towards the fixed anchor F instead of 0, which no permutation of hidden units leaves invariant.
  Here θ₀ covers the weights of the asymmetric layers only (biases and norm parameters are not anchored).
  The default ``offsets="masked"`` is the reference's layout and gives the same bytes as before the option.
* :func:`fold_fixed_structure` returns the stock model of the same architecture whose weights are the effective
  ``W_eff``: the same function, with the permutation symmetry of a standard network (used to align the
  *functions* of two asymmetric networks).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_serializer, model_validator
from torch import nn

from .._util.digest import tensor_bytes
from ..errors import ConfigError, StateDictMismatchError

DEFAULT_SIGMA_F = 1.0
"""Default σ_F: the paper's value at which unaligned barriers of W-MLPs on MNIST are near zero."""

DEFAULT_DENSITY = 0.125
"""Default fraction of masked entries per row when neither ``num_fixed`` nor ``density`` is given."""

FIXED_BUFFERS = ("fixed_offsets", "fixed_mask")
"""Buffer names of the fixed structure (F, D) of every asymmetric layer."""

_SEED_DOMAIN = "modeconn.asymmetric.v1"


# ------------------------------------------------------------------------------------------- config


class AsymmetricConfig(BaseModel):
    """The ``asymmetric`` option of the architectures ``mlp``, ``vgg``, ``cnn`` and ``resnet20``.

    Fields:
        sigma_f: σ_F ≥ 0, finite, the scale of the fixed offsets F (default 1.0; 0 → sparse "D only" net).
        num_fixed: masked (fixed) entries per row, the same count in every asymmetric layer; must be
            < the fan-in of each of them. Mutually exclusive with ``density``.
        density: fraction of masked entries per row in [0, 1), rounded half up per layer and capped at fan-in − 1.
            Default 0.125 when ``num_fixed`` is not given either (the default is written into the config).
        mask_seed: seed of F and D (default 0). Two models with the same architecture and ``mask_seed``
            share F and D bytes, in any process; the trained weights follow ``build_model(seed=...)``.
        layers: ``"all"`` (default, as the reference: every Linear/Conv including the first layer and
            the classifier head) or ``"hidden"`` (all but the first layer and the head).
        offsets: ``"masked"`` (default, the reference: F only where D = 0) or ``"dense"`` (F at every entry;
            with ``density=0`` and weight decay this is syre, see the module docstring).

    Invalid values raise a pydantic ``ValidationError`` here; through :func:`build_model` and
    :func:`as_asymmetric_config` they become :class:`ConfigError` naming the field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    sigma_f: float = Field(DEFAULT_SIGMA_F, ge=0.0, allow_inf_nan=False)
    num_fixed: StrictInt | None = Field(None, ge=0)
    density: float | None = Field(None, ge=0.0, lt=1.0)
    mask_seed: StrictInt = 0
    layers: Literal["all", "hidden"] = "all"
    offsets: Literal["masked", "dense"] = "masked"

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        """The default ``offsets="masked"`` is left out, so configs of reference-layout models read as before."""
        data = handler(self)
        if data.get("offsets") == "masked":
            data.pop("offsets")
        return data

    def layer_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :class:`AsymLinear` / :class:`AsymConv2d` this config gives (without ``key``)."""
        return dict(sigma_f=self.sigma_f, num_fixed=self.num_fixed, density=self.density, mask_seed=self.mask_seed,
                    offsets=self.offsets)

    @model_validator(mode="wrap")
    @classmethod
    def _validate(cls, data: Any, handler: Any) -> AsymmetricConfig:
        if isinstance(data, Mapping):
            unknown = sorted(str(k) for k in data if k not in cls.model_fields)
            if unknown:
                raise ValueError(
                    f"unknown asymmetric option(s) {', '.join(map(repr, unknown))}; "
                    f"valid options: {', '.join(cls.model_fields)}"
                )
            data = dict(data)
            if data.get("num_fixed") is not None and data.get("density") is not None:
                raise ValueError(
                    "asymmetric options num_fixed and density are mutually exclusive "
                    f"(got num_fixed={data['num_fixed']!r}, density={data['density']!r}); give one of them"
                )
            if data.get("num_fixed") is None and data.get("density") is None:
                data["density"] = DEFAULT_DENSITY
        try:
            return handler(data)
        except ValidationError as err:
            # re-raise with the field names in the text: the architecture-kwargs error reporter only keeps
            # the top-level name ("asymmetric") of a nested location
            parts = [
                f"{'.'.join(['asymmetric', *map(str, e['loc'])])}: {e['msg']} (got {e.get('input')!r})"
                for e in err.errors()
            ]
            raise ValueError("; ".join(parts)) from None


AsymmetricOption = AsymmetricConfig | None
"""Type of the ``asymmetric`` architecture kwarg: ``None`` (standard layers) or an :class:`AsymmetricConfig`."""


def as_asymmetric_config(value: AsymmetricConfig | Mapping[str, Any] | None) -> AsymmetricConfig | None:
    """Coerce ``None`` / a mapping / a config to ``AsymmetricConfig | None``.

    Raises:
        ConfigError: invalid fields (named in the message) or a value of another type.
    """
    if value is None or isinstance(value, AsymmetricConfig):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"asymmetric must be None, a mapping or an AsymmetricConfig, got {type(value).__name__}")
    try:
        return AsymmetricConfig(**value)
    except ValidationError as err:
        msgs = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in err.errors())
        raise ConfigError(f"invalid asymmetric option: {msgs}") from None


def layer_asymmetry(asym: AsymmetricConfig | None, *, boundary: bool) -> AsymmetricConfig | None:
    """The config for one layer: ``None`` when ``asym`` is None, or when ``boundary`` (the network's first
    layer or its classifier head) and ``asym.layers == "hidden"``."""
    if asym is None or (boundary and asym.layers == "hidden"):
        return None
    return asym


# ------------------------------------------------------------------------------- seeds and generation


def layer_seed(mask_seed: int, key: str) -> int:
    """A 63-bit generator seed from ``(mask_seed, key)``: the first 8 bytes of sha256, little-endian.

    Stable across processes, platforms and Python versions (unlike ``hash()``).
    """
    if not isinstance(mask_seed, int) or isinstance(mask_seed, bool):
        raise ConfigError(f"mask_seed must be an int, got {mask_seed!r}")
    text = f"{_SEED_DOMAIN}\x00{int(mask_seed)}\x00{key}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") & ((1 << 63) - 1)


def resolve_num_fixed(fan_in: int, num_fixed: int | None, density: float | None, where: str = "layer") -> int:
    """Masked entries per row for a row of ``fan_in`` entries (see the module docstring).

    Raises:
        ConfigError: both or a bad ``num_fixed`` (< 0 or ≥ fan_in: at least one trainable entry per row)
            or ``density`` (outside [0, 1)); the message names the option, ``where`` and the fan-in.
    """
    if num_fixed is not None and density is not None:
        raise ConfigError(f"{where}: num_fixed and density are mutually exclusive (got {num_fixed!r}, {density!r})")
    if num_fixed is None:
        d = DEFAULT_DENSITY if density is None else density
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not (0.0 <= float(d) < 1.0):
            raise ConfigError(f"{where}: density must be a number in [0, 1), got {d!r}")
        return min(math.floor(float(d) * fan_in + 0.5), fan_in - 1)
    if isinstance(num_fixed, bool) or not isinstance(num_fixed, int) or num_fixed < 0:
        raise ConfigError(f"{where}: num_fixed must be an int ≥ 0, got {num_fixed!r}")
    if num_fixed >= fan_in:
        raise ConfigError(
            f"{where}: num_fixed={num_fixed} must be < the fan-in {fan_in} (each row needs at least one "
            "trainable entry); lower num_fixed or use density (a fraction of each layer's fan-in)"
        )
    return num_fixed


def generate_fixed_structure(
    rows: int, fan_in: int, num_fixed: int, sigma_f: float, seed: int, offsets: str = "masked"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(F, D)``, both fp32 CPU tensors of shape (rows, fan_in), from a fresh generator seeded ``seed``.

    Each row of D has exactly ``num_fixed`` zeros at uniformly random positions (argsort of uniform
    scores, stable); F = σ_F · N(0, 1) where D = 0 and +0.0 elsewhere (``offsets="masked"``), or at every
    entry (``offsets="dense"``; the same normal draws, so the masked entries agree with the masked layout).

    Raises:
        ConfigError: ``offsets`` is neither "masked" nor "dense".
    """
    if offsets not in ("masked", "dense"):
        raise ConfigError(f"offsets must be 'masked' or 'dense', got {offsets!r}")
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    scores = torch.rand(rows, fan_in, generator=g, device="cpu")
    normal = torch.randn(rows, fan_in, generator=g, device="cpu")
    mask = torch.ones(rows, fan_in, device="cpu")
    if num_fixed > 0:
        idx = torch.argsort(scores, dim=1, stable=True)[:, :num_fixed]
        mask.scatter_(1, idx, 0.0)
    where = mask == 0 if offsets == "masked" else torch.ones_like(mask, dtype=torch.bool)
    fixed = torch.zeros(rows, fan_in, device="cpu")
    if sigma_f > 0:
        fixed = torch.where(where, normal * float(sigma_f), fixed)
    return fixed, mask


def _check_sigma_f(sigma_f: Any, where: str) -> float:
    if isinstance(sigma_f, bool) or not isinstance(sigma_f, (int, float)) or not math.isfinite(sigma_f) or sigma_f < 0:
        raise ConfigError(f"{where}: sigma_f must be a finite number ≥ 0, got {sigma_f!r}")
    return float(sigma_f)


# ------------------------------------------------------------------------------------------- layers


class _AsymmetricMixin:
    """Shared logic of :class:`AsymLinear` and :class:`AsymConv2d` (``weight`` of shape (out, ...))."""

    _BASE: type[nn.Module]  # the stock layer the subclass extends (nn.Linear, nn.Conv2d)

    def reset_parameters(self) -> None:
        """The stock layer's initialisation of W and b, then the masked entries of W set to 0."""
        self._BASE.reset_parameters(self)
        self._zero_masked_weight()

    def extra_repr(self) -> str:
        return f"{self._BASE.extra_repr(self)}, {self._asym_repr()}"

    fixed_buffers: tuple[str, ...] = FIXED_BUFFERS
    weight: nn.Parameter
    fixed_offsets: torch.Tensor
    fixed_mask: torch.Tensor

    def _init_asymmetry(
        self, sigma_f: float, num_fixed: int | None, density: float | None, mask_seed: int, key: str,
        offsets: str = "masked",
    ) -> None:
        where = f"{type(self).__name__} {key!r}" if key else type(self).__name__
        self.sigma_f = _check_sigma_f(sigma_f, where)
        if offsets not in ("masked", "dense"):
            raise ConfigError(f"{where}: offsets must be 'masked' or 'dense', got {offsets!r}")
        self.offsets = offsets
        fan_in = self.weight[0].numel()
        self.num_fixed = resolve_num_fixed(fan_in, num_fixed, density, where)
        self.density = density
        self.mask_seed = mask_seed
        self.structure_key = key
        self.structure_seed = layer_seed(mask_seed, key)
        w = self.weight
        # register placeholders first (module state), then fill them (skipped for shape-only meta builds)
        self.register_buffer("fixed_offsets", torch.zeros(w.shape, dtype=w.dtype, device=w.device), persistent=True)
        self.register_buffer("fixed_mask", torch.ones(w.shape, dtype=w.dtype, device=w.device), persistent=True)
        if w.is_meta:  # shape-only build (e.g. load_checkpoint's probe): nothing to generate
            return
        offsets, mask = self.regenerate_fixed_structure()
        with torch.no_grad():
            self.fixed_offsets.copy_(offsets)
            self.fixed_mask.copy_(mask)
        self._zero_masked_weight()

    def regenerate_fixed_structure(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(F, D)`` regenerated from this layer's (mask_seed, key, num_fixed, sigma_f) on the CPU, in the
        weight's shape and dtype. Equal to the buffers unless they were modified or loaded from elsewhere."""
        shape = self.weight.shape
        offsets, mask = generate_fixed_structure(
            shape[0], math.prod(shape[1:]), self.num_fixed, self.sigma_f, self.structure_seed, self.offsets
        )
        dtype = self.weight.dtype
        return offsets.reshape(shape).to(dtype), mask.reshape(shape).to(dtype)

    def reset_fixed_entries(self) -> None:
        """Set the masked entries of W to +0.0 (their invariant) after W was assigned from elsewhere."""
        self._zero_masked_weight()

    def _zero_masked_weight(self) -> None:
        mask = getattr(self, "fixed_mask", None)
        if mask is not None and not self.weight.is_meta:
            with torch.no_grad():
                self.weight.masked_fill_(mask == 0, 0.0)

    def symmetric_fixed_structure(self) -> dict[str, torch.Tensor]:
        """Values of the fixed buffers under which this layer computes its stock base layer (F = 0, D = 1). The
        W-asymmetry breaks the permutation symmetry by design, so a traced spec's self-check
        (:mod:`modeconn.symmetry.selfcheck`) tests function preservation there."""
        return {"fixed_offsets": torch.zeros_like(self.fixed_offsets), "fixed_mask": torch.ones_like(self.fixed_mask)}

    def effective_weight(self) -> torch.Tensor:
        """``W_eff = F + D ⊙ W`` (same shape as ``weight``); differentiable in W only."""
        return self.fixed_offsets + self.fixed_mask * self.weight

    def _asym_repr(self) -> str:
        dense = ", offsets='dense'" if self.offsets == "dense" else ""
        return (f"sigma_f={self.sigma_f}, num_fixed={self.num_fixed}, mask_seed={self.mask_seed}, "
                f"key={self.structure_key!r}{dense}")


class AsymLinear(_AsymmetricMixin, nn.Linear):
    _BASE = nn.Linear
    """W-asymmetric ``nn.Linear``: ``y = x (F + D ⊙ W)ᵀ + b``; (N, *, in_features) → (N, *, out_features).

    Args:
        in_features, out_features, bias, device, dtype: as ``nn.Linear``.
        sigma_f: σ_F ≥ 0 (default 1.0).
        num_fixed: masked entries per row (< in_features), or
        density: fraction masked per row in [0, 1); neither → ``DEFAULT_DENSITY``.
        mask_seed, key: F and D come from :func:`layer_seed` ``(mask_seed, key)``; ``key`` should be the
            layer's qualified name in its model (the architectures pass it), so layers of one model differ.
        offsets: "masked" (F only where D = 0) or "dense" (F everywhere; syre with ``density=0``).

    Buffers: ``fixed_offsets`` F and ``fixed_mask`` D, shape (out_features, in_features), persistent.

    Raises:
        ConfigError: sigma_f < 0 / non-finite, num_fixed ≥ in_features or < 0, both num_fixed and density,
            density outside [0, 1), offsets not "masked" / "dense".
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        sigma_f: float = DEFAULT_SIGMA_F,
        num_fixed: int | None = None,
        density: float | None = None,
        mask_seed: int = 0,
        key: str = "",
        offsets: str = "masked",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        nn.Linear.__init__(self, in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._init_asymmetry(sigma_f, num_fixed, density, mask_seed, key, offsets)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.effective_weight(), self.bias)


class AsymConv2d(_AsymmetricMixin, nn.Conv2d):
    _BASE = nn.Conv2d
    """W-asymmetric ``nn.Conv2d``: the convolution with kernel ``F + D ⊙ W``; rows are output channels.

    Each output channel has ``num_fixed`` masked entries among its ``in_channels/groups · kh · kw``.
    Arguments as ``nn.Conv2d`` plus ``sigma_f``, ``num_fixed``, ``density``, ``mask_seed``, ``key``, ``offsets``
    (see :class:`AsymLinear`). Buffers ``fixed_offsets``, ``fixed_mask`` have the weight's shape.

    Raises:
        ConfigError: as :class:`AsymLinear` (the fan-in is ``in_channels/groups · kh · kw``).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        *,
        sigma_f: float = DEFAULT_SIGMA_F,
        num_fixed: int | None = None,
        density: float | None = None,
        mask_seed: int = 0,
        key: str = "",
        offsets: str = "masked",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        nn.Conv2d.__init__(
            self, in_channels, out_channels, kernel_size, stride=stride, padding=padding, dilation=dilation,
            groups=groups, bias=bias, padding_mode=padding_mode, device=device, dtype=dtype,
        )
        self._init_asymmetry(sigma_f, num_fixed, density, mask_seed, key, offsets)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(input, self.effective_weight(), self.bias)


ASYMMETRIC_LAYERS: tuple[type[nn.Module], ...] = (AsymLinear, AsymConv2d)


# ---------------------------------------------------------------------------------- fixed structure


def _fixed_modules(model: nn.Module) -> Iterable[tuple[str, nn.Module]]:
    for name, mod in model.named_modules():
        if getattr(type(mod), "fixed_buffers", None):
            yield name, mod


def fixed_structure_keys(model: nn.Module) -> list[str]:
    """State-dict keys of every fixed-structure buffer (``<module>.fixed_offsets``, ``<module>.fixed_mask``,
    ``<module>.fixed_gate``) of the modules declaring ``fixed_buffers``, in state-dict order. Empty for a standard
    model."""
    return fixed_structure_keys_of(model, nn.Module)


def fixed_structure_keys_of(model: nn.Module, types: type | tuple[type, ...]) -> list[str]:
    """:func:`fixed_structure_keys` restricted to the modules that are instances of ``types``."""
    wanted = {
        f"{name}.{b}" if name else b
        for name, mod in _fixed_modules(model) if isinstance(mod, types)
        for b in type(mod).fixed_buffers
    }
    return [k for k in model.state_dict(keep_vars=True) if k in wanted]


def fixed_structure_digest(
    model_or_state_dict: nn.Module | Mapping[str, torch.Tensor], keys: Iterable[str] | None = None
) -> str:
    """sha256 (hex) over the fixed-structure buffers, sorted by key: for each key its name, dtype, shape
    and raw bytes (CPU, contiguous). ``keys`` defaults to :func:`fixed_structure_keys` of a model and is
    required for a state dict.

    Raises:
        ConfigError: a state dict without ``keys``.
        StateDictMismatchError: a key missing from the state dict.
    """
    if isinstance(model_or_state_dict, nn.Module):
        sd: Mapping[str, torch.Tensor] = model_or_state_dict.state_dict()
        keys = fixed_structure_keys(model_or_state_dict) if keys is None else list(keys)
    else:
        if keys is None:
            raise ConfigError("fixed_structure_digest: pass keys=... with a state dict (fixed_structure_keys(model))")
        sd = model_or_state_dict
        keys = list(keys)
    h = hashlib.sha256()
    for key in sorted(keys):
        if key not in sd:
            raise StateDictMismatchError(f"fixed_structure_digest: key {key!r} is not in the state dict")
        t = sd[key]
        header = f"{key}\x00{str(t.dtype).removeprefix('torch.')}\x00{tuple(t.shape)}\x00".encode()
        h.update(len(header).to_bytes(8, "little"))
        h.update(header)
        data = tensor_bytes(t)
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def fixed_structure_mismatches(model: nn.Module) -> list[str]:
    """Keys of fixed buffers that differ (bytes) from the ones regenerated from each layer's seed and key.

    Covers every module declaring ``fixed_buffers`` and ``regenerate_fixed_structure()`` (one tensor per buffer, in
    that order): W-asymmetric layers (F, D) and FiGLU gates (:mod:`.gating`). Empty when the model's fixed
    buffers are exactly those ``build_model`` creates from its config.
    """
    bad: list[str] = []
    for name, mod in _fixed_modules(model):
        regen = getattr(mod, "regenerate_fixed_structure", None)
        if regen is None:
            continue
        prefix = f"{name}." if name else ""
        for buf, expected in zip(type(mod).fixed_buffers, regen(), strict=True):
            actual = getattr(mod, buf).detach().to("cpu")
            if actual.dtype != expected.dtype or actual.shape != expected.shape or not torch.equal(actual, expected):
                bad.append(prefix + buf)
    return bad


__all__ = [
    "ASYMMETRIC_LAYERS",
    "DEFAULT_DENSITY",
    "DEFAULT_SIGMA_F",
    "FIXED_BUFFERS",
    "AsymConv2d",
    "AsymLinear",
    "AsymmetricConfig",
    "AsymmetricOption",
    "as_asymmetric_config",
    "fixed_structure_digest",
    "fixed_structure_keys",
    "fixed_structure_keys_of",
    "fixed_structure_mismatches",
    "fold_fixed_structure",
    "generate_fixed_structure",
    "layer_asymmetry",
    "layer_seed",
    "resolve_num_fixed",
]


def fold_fixed_structure(model: nn.Module) -> nn.Module:
    """The stock (``asymmetric=None``) model of ``model``'s architecture whose weights are ``model``'s effective
    weights ``W_eff = F + D ⊙ W``: the same function (same outputs for every input), with the full permutation
    symmetry of a standard network, so weight matching can align the *functions* of two W-asymmetric networks.

    Every other tensor (biases, norms, FiGLU gates, buffers) is copied; the result is on ``model``'s device, in its
    training mode, with a ``modeconn_config`` that omits ``asymmetric``. ``model`` is not modified.

    Raises:
        ConfigError: ``model`` was not built by :func:`~modeconn.models.build_model`.
    """
    from ._build import build_model, model_config

    cfg = model_config(model)
    kwargs = {k: v for k, v in cfg["kwargs"].items() if k != "asymmetric"}
    with torch.device("cpu"):
        stock = build_model(cfg["architecture"], seed=0, **kwargs)
    state = {k: v for k, v in model.state_dict().items() if k not in set(fixed_structure_keys_of(model, ASYMMETRIC_LAYERS))}
    for name, mod in model.named_modules():
        if isinstance(mod, ASYMMETRIC_LAYERS):
            state[f"{name}.weight" if name else "weight"] = mod.effective_weight().detach()
    stock.load_state_dict(state)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    return stock.to(device).train(model.training)

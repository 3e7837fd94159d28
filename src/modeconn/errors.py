"""One exception hierarchy for modeconn.

Every error raised on bad input derives from :class:`ModeconnError`, so callers can catch one type.
Messages name the offending key, shape, file or option.
"""

from __future__ import annotations


class ModeconnError(Exception):
    """Base class of every error modeconn raises on purpose."""


class ConfigError(ModeconnError, ValueError):
    """An option, method name, architecture name or config value is invalid (typos included)."""


class SpecError(ModeconnError, ValueError):
    """A symmetry spec is inconsistent: a tensor unbound or bound twice, a size mismatch, a bad element."""


class TraceError(ModeconnError):
    """torch.fx tracing failed or met an operation the spec builder does not understand."""


class UnsupportedOperationError(TraceError):
    """The traced graph contains an op whose symmetry handling is unknown; the message names the node."""


class StateDictMismatchError(ModeconnError, ValueError):
    """Two state dicts (or a state dict and a spec/model) disagree in keys, shapes or dtypes."""


class NonFiniteError(ModeconnError, ValueError):
    """NaN or Inf found in weights, activations or a cost matrix; the message names the tensor/space."""


class DeviceMismatchError(ModeconnError, ValueError):
    """Tensors of one call live on different devices."""


class CheckpointError(ModeconnError):
    """A checkpoint directory or weights file is missing, truncated, of an unsafe format or inconsistent."""


class DataError(ModeconnError):
    """A dataset is missing, truncated, of the wrong format or fails its checksum."""


class AbsorptionError(ModeconnError):
    """A normalization-absorption step changed the model's outputs beyond the tolerance (names the step)."""


class DistributedError(ModeconnError, RuntimeError):
    """Ranks of a multi-process run disagree (different batches, λ or learned elements on different ranks)."""

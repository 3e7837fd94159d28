"""modeconn: mode connectivity toolkit for PyTorch.

```python
import modeconn as mc
spec = mc.symmetry_spec(model, example_input)
res = mc.weight_matching(spec, sd_a, sd_b)
curve = mc.evaluate_path(model, sd_a, spec.apply(sd_b, res.element), loader)
curve.barrier("mean")
```
"""

__version__ = "0.1.0"

from . import errors
from .diagnostics import check
from .io import load_checkpoint, save_checkpoint
from .io.lazy import LazyCheckpoint
from .match import (
    Alignment,
    DualAlignment,
    activation_matching,
    dual_matching,
    learned_matching,
    one_sided_matching,
    weight_matching,
)
from .models import build_model
from .moe import dense_to_moe
from .path import Curve, evaluate_path, interpolate, merge
from .stream import stream_apply, stream_merge, stream_weight_matching
from .symmetry import Space, SymmetrySpec, absorb_normalization, symmetry_spec

__all__ = [
    "Alignment", "Curve", "DualAlignment", "LazyCheckpoint", "Space", "SymmetrySpec", "absorb_normalization",
    "activation_matching", "build_model", "check", "dense_to_moe", "dual_matching", "errors", "evaluate_path",
    "interpolate", "learned_matching",
    "load_checkpoint", "merge", "one_sided_matching", "save_checkpoint", "stream_apply", "stream_merge",
    "stream_weight_matching", "symmetry_spec", "weight_matching",
]

"""Mean, spread and count of repeated measurements, and how they print (no spread for a single sample)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean_std(values: Sequence[float], ddof: int = 1) -> dict[str, float | int | None]:
    """``{"mean", "std", "n"}`` of the finite ``values``: ``std`` is the standard deviation with ``ddof`` (default 1,
    the sample standard deviation) and None when there are not more than ``ddof`` values; ``mean`` is None for
    none."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(vals)
    mean = sum(vals) / n if n else None
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - ddof)) if n > ddof else None
    return {"mean": mean, "std": std, "n": n}


def format_mean_std(stat: dict, scale: float = 1.0, digits: int = 3, show_n: bool = False) -> str:
    """"m ± s" of a :func:`mean_std` dict (times ``scale``); just "m" when there is one sample (no spread to show),
    "n/a" when there is none; with ``show_n`` the count follows as " (n=k)"."""
    if stat.get("mean") is None:
        return "n/a"
    text = f"{scale * stat['mean']:.{digits}f}"
    if stat.get("n", 0) > 1 and stat.get("std") is not None:
        text += f" ± {scale * stat['std']:.{digits}f}"
    return text + (f" (n={stat['n']})" if show_n else "")

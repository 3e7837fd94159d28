"""How much memory this machine has free: what commands that load whole models check before loading them."""

from __future__ import annotations

import os
from pathlib import Path


def available_bytes() -> int | None:
    """Bytes of memory available to new allocations without swapping (Linux ``MemAvailable``; else free physical
    pages), or None where the system does not say."""
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"

"""Downloading MNIST / Fashion-MNIST with pooch, keeping only verified bytes.

The upstream ``.gz`` files are fetched with :class:`pooch.HTTPDownloader` into a temporary file next to the
destination, decompressed, and the SHA-256 of the decompressed content is checked against
:data:`modeconn.data.checksums.KNOWN_SHA256` (pinned content hashes; compressed bytes differ between
mirrors and re-packagings). Only a file that verifies is renamed into place; anything else is deleted and
a DataError raised, so unverified bytes are never kept.
"""

from __future__ import annotations

import os
from pathlib import Path

from .._util.atomic import atomic_path
from ..errors import DataError
from .checksums import KNOWN_SHA256, verify_content_sha256
from .idx import read_idx_bytes
from .locate import IDX_STEMS, idx_file

#: Mirrors tried in order; each serves ``<stem>.gz``.
MIRRORS: dict[str, tuple[str, ...]] = {
    "mnist": ("https://ossci-datasets.s3.amazonaws.com/mnist/",
              "https://storage.googleapis.com/cvdf-datasets/mnist/"),
    "fashion-mnist": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
}


def _fetch(url: str, output: Path) -> None:
    """Download ``url`` to ``output`` (replaced in tests)."""
    import pooch

    pooch.HTTPDownloader(progressbar=False, timeout=60)(url, str(output), None)


def _download_verified(url: str, tmp: Path, expected: str) -> None:
    """Download ``url`` to ``tmp`` and check its content; DataError naming the URL on a network error or a
    wrong hash."""
    try:
        _fetch(url, tmp)
    except Exception as exc:  # network errors of any kind
        raise DataError(f"{url}: {type(exc).__name__}: {exc}") from exc
    verify_content_sha256(read_idx_bytes(tmp), expected, url)


def download_idx(name: str, dest: str | os.PathLike) -> Path:
    """Download the four IDX files of ``name`` ("mnist" or "fashion-mnist") into ``dest``.

    Files already present in ``dest`` are kept (they are verified when loaded). Returns ``dest``.

    Raises:
        DataError: no mirror delivered a file that passes its SHA-256 check (the message gives, per URL,
            the network error or the expected and actual hash); nothing unverified is left in ``dest``.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for stem in IDX_STEMS:
        if idx_file(dest, stem) is not None:
            continue
        errors = []
        for base in MIRRORS[name]:
            try:
                with atomic_path(dest / f"{stem}.gz", suffix=".part") as tmp:
                    _download_verified(f"{base}{stem}.gz", tmp, KNOWN_SHA256[name, stem])
                break
            except DataError as exc:  # network error, corrupt or substituted file: discarded, try the next mirror
                errors.append(f"  {exc}")
        else:
            raise DataError(f"could not download {stem}.gz of {name!r}:\n" + "\n".join(errors))
    return dest

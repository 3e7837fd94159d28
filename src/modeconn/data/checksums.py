"""SHA-256 checks for dataset files.

Policy: MNIST and Fashion-MNIST are verified by the SHA-256 of their *decompressed* IDX content
(:data:`KNOWN_SHA256`). The same content ships in several wrappings (upstream ``.gz``, Debian's re-gzipped
copies, our ``gzip -9 -n`` copies in ``shared/data``, uncompressed files), all of which then verify alike,
and a download is checked after decompression before it is kept. The hashes were computed from the
``shared/data`` copies, whose decompressed MD5s match the canonical published MNIST / Fashion-MNIST values.
"""

from __future__ import annotations

import hashlib
import os

from .._util.digest import sha256_file as _sha256_file
from ..errors import DataError

#: (dataset, IDX file stem) -> SHA-256 of the decompressed file content.
KNOWN_SHA256: dict[tuple[str, str], str] = {
    ("mnist", "train-images-idx3-ubyte"): "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    ("mnist", "train-labels-idx1-ubyte"): "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    ("mnist", "t10k-images-idx3-ubyte"): "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    ("mnist", "t10k-labels-idx1-ubyte"): "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    ("fashion-mnist", "train-images-idx3-ubyte"):
        "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    ("fashion-mnist", "train-labels-idx1-ubyte"):
        "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    ("fashion-mnist", "t10k-images-idx3-ubyte"):
        "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    ("fashion-mnist", "t10k-labels-idx1-ubyte"):
        "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of the bytes of ``path`` as stored (no decompression). Raises DataError if unreadable."""
    try:
        return _sha256_file(path, chunk_size=chunk_size)
    except OSError as exc:
        raise DataError(f"cannot read {path} to checksum it: {exc}") from exc


def _mismatch(what: str, expected: str, actual: str, hint: str) -> DataError:
    return DataError(f"SHA-256 mismatch for {what}: expected {expected}, actual {actual}. {hint}".rstrip())


def verify_sha256(path: str | os.PathLike, expected: str) -> str:
    """Check that the stored bytes of ``path`` have SHA-256 ``expected`` (hex, case-insensitive).

    Returns the hash. Raises DataError naming the file, the expected and the actual hash on mismatch.
    """
    actual = sha256_file(path)
    if actual != expected.lower():
        raise _mismatch(str(path), expected.lower(), actual, "The file is corrupt or not the one expected.")
    return actual


def verify_content_sha256(content: bytes, expected: str, source: str | os.PathLike) -> str:
    """Check the SHA-256 of already-read (decompressed) ``content`` of file ``source``.

    Returns the hash. Raises DataError naming ``source``, the expected and the actual hash on mismatch.
    """
    actual = hashlib.sha256(content).hexdigest()
    if actual != expected.lower():
        raise _mismatch(
            f"the decompressed content of {source}",
            expected.lower(),
            actual,
            "The file is corrupt or holds different data; pass verify=False to load it anyway.",
        )
    return actual

"""Reader (and a small writer) for the IDX format of MNIST and Fashion-MNIST.

IDX layout (big-endian): two zero bytes, one type byte, one byte giving the number of dimensions ``ndim``,
then ``ndim`` unsigned 32-bit sizes, then ``prod(sizes)`` items of the given type in C order. MNIST images
are magic ``0x00000803`` (uint8, dims N, 28, 28), labels ``0x00000801`` (uint8, dim N). Files may be
gzip-compressed; compression is detected from the gzip magic bytes, not from the file name.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from ..errors import DataError

# IDX type byte -> numpy dtype (big-endian as stored on disk).
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES = {dt.newbyteorder("="): code for code, dt in IDX_DTYPES.items()}

_GZIP_MAGIC = b"\x1f\x8b"


def read_idx_bytes(path: str | os.PathLike) -> bytes:
    """The raw IDX bytes of ``path``, decompressed first if the file is gzip-compressed.

    Raises:
        DataError: the file cannot be read, or its gzip stream is corrupt or truncated.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read IDX file {path}: {exc}") from exc
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(f"corrupt or truncated gzip file {path}: {exc}") from exc
    return data


def parse_idx(data: bytes, source: str | os.PathLike = "<bytes>") -> np.ndarray:
    """Decode uncompressed IDX bytes into a writable, native-byte-order numpy array of shape ``dims``.

    ``source`` only names the file in error messages.

    Raises:
        DataError: bad magic number, unknown type byte, or a data length that disagrees with the header
            (the message gives expected and actual byte counts).
    """
    if len(data) < 4:
        raise DataError(f"{source}: not an IDX file (only {len(data)} bytes, the header alone needs 4)")
    zero, code, ndim = data[0:2], data[2], data[3]
    if zero != b"\x00\x00" or code not in IDX_DTYPES or ndim == 0:
        raise DataError(
            f"{source}: bad IDX magic number 0x{data[:4].hex()} "
            f"(expected 0x0000TTNN with type byte TT in {{{', '.join(f'0x{c:02x}' for c in IDX_DTYPES)}}} "
            "and NN >= 1 dimensions)"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(
            f"{source}: truncated IDX header: expected {header} bytes for {ndim} dimensions, got {len(data)}"
        )
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype = IDX_DTYPES[code]
    expected = header + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "has trailing bytes"
        raise DataError(
            f"{source}: IDX file {what}: header says dims {tuple(dims)} of {dtype.newbyteorder('=')}, "
            f"so expected {expected} bytes, actual {len(data)} bytes"
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="))  # copies: writable and native byte order


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (gzipped or not) into a numpy array.

    Returns:
        A writable array in native byte order whose shape is the header's dims, e.g. ``(N, 28, 28)``
        uint8 pixels (0–255) for MNIST images or ``(N,)`` uint8 labels.

    Raises:
        DataError: unreadable file, corrupt gzip, bad magic number, or data length not matching the
            header (truncated file); the message names the file.
    """
    return parse_idx(read_idx_bytes(path), path)


def write_idx(path: str | os.PathLike, array: np.ndarray, *, compress: bool = False) -> Path:
    """Write ``array`` as an IDX file (gzip-compressed, deterministic bytes, if ``compress``).

    Supported dtypes: uint8, int8, int16, int32, float32, float64. Raises DataError otherwise.
    """
    arr = np.asarray(array)
    code = _CODES.get(arr.dtype.newbyteorder("="))
    if code is None or arr.ndim == 0:
        raise DataError(f"cannot write IDX {path}: unsupported dtype {arr.dtype} or 0-d array")
    body = struct.pack(f">BBBB{arr.ndim}I", 0, 0, code, arr.ndim, *arr.shape)
    body += np.ascontiguousarray(arr, dtype=IDX_DTYPES[code]).tobytes()
    if compress:
        body = gzip.compress(body, compresslevel=9, mtime=0)
    path = Path(path)
    path.write_bytes(body)
    return path

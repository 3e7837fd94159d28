"""Finding dataset directories on disk.

Search order (first directory holding every required file wins):

1. ``root`` when given — the dataset directory itself, or a parent holding one of the dataset's usual
   sub-directory names (e.g. ``mnist/``, ``MNIST/raw/``). An explicit root is authoritative: if the data
   is not there, nothing else is searched (a typo in ``--data`` must not silently pick other data).
2. the environment variable ``MODECONN_DATA`` — a parent directory, searched the same way; when it is
   not set, its default: ``shared/data`` beside the source checkout modeconn is imported from (an editable
   install of the repository, as ``make`` sets it), then ``../shared/data`` relative to the working
   directory (see :func:`default_data_roots`);
3. system directories (Debian's ``/usr/share/datasets/fashion-mnist`` for Fashion-MNIST);
4. the download cache (``pooch.os_cache("modeconn")/<name>``), where earlier downloads were kept.

With ``download=True`` a dataset that supports it (MNIST, Fashion-MNIST) is then downloaded into
``root/<name>`` (if root was given) or the cache, and verified before it is kept. ``download=None`` (the
default of :func:`find_data_dir` and :func:`~modeconn.data.load_dataset`) takes the value set by the
innermost :func:`downloads_allowed` block (False outside one): the command line's ``--download``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, DataError
from .cifar import CIFAR10_FILES, CIFAR100_FILES

ENV_VAR = "MODECONN_DATA"
#: The default of ``$MODECONN_DATA``: this folder, relative to the checkout's parent and to the working directory.
DEFAULT_DATA = Path("shared") / "data"

_DOWNLOAD: ContextVar[bool] = ContextVar("modeconn_download", default=False)

#: Standard IDX file stems of MNIST and Fashion-MNIST; each may be present as ``stem`` or ``stem.gz``.
IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@dataclass(frozen=True)
class Layout:
    """Where a file-backed dataset lives: usual sub-directory names and the files it needs."""

    subdirs: tuple[str, ...]
    files: tuple[str, ...]
    idx: bool = False  # files are IDX stems that may carry a .gz suffix
    system_dirs: tuple[str, ...] = ()
    downloadable: bool = False


LAYOUTS: dict[str, Layout] = {
    "mnist": Layout(("mnist", "MNIST/raw"), IDX_STEMS, idx=True, downloadable=True),
    "fashion-mnist": Layout(("fashion-mnist", "FashionMNIST/raw"), IDX_STEMS, idx=True,
                            system_dirs=("/usr/share/datasets/fashion-mnist",), downloadable=True),
    "cifar10": Layout(("cifar-10-batches-py", "cifar10/cifar-10-batches-py", "cifar10"), CIFAR10_FILES),
    "cifar100": Layout(("cifar-100-python", "cifar100/cifar-100-python", "cifar100"), CIFAR100_FILES),
    # a text file, found as austen.txt or austen.txt.gz (the same stem[.gz] rule as the IDX files)
    "austen": Layout(("austen",), ("austen.txt",), idx=True),
    # pretrained all-MiniLM-L6-v2 (Hugging Face layout) for the planted-recovery checks
    "minilm": Layout(("minilm",), ("config.json", "model.safetensors", "tokenizer.json")),
}


def cache_dir() -> Path:
    """Root of the download cache, ``pooch.os_cache("modeconn")`` (e.g. ``~/.cache/modeconn``)."""
    import pooch

    return Path(pooch.os_cache("modeconn"))


@contextmanager
def downloads_allowed(allowed: bool = True) -> Iterator[None]:
    """Inside the block, ``find_data_dir(..., download=None)`` downloads missing MNIST / Fashion-MNIST when
    ``allowed`` (the command line's ``--download``); the previous setting is restored on exit."""
    token = _DOWNLOAD.set(bool(allowed))
    try:
        yield
    finally:
        _DOWNLOAD.reset(token)


def source_checkout() -> Path | None:
    """The repository checkout modeconn is imported from (``<checkout>/src/modeconn``, an editable install), or
    None for an installed package (no ``pyproject.toml`` two levels above the package)."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "pyproject.toml").is_file() and (root / "src" / "modeconn").is_dir() else None


def default_data_roots() -> list[tuple[str, Path]]:
    """Where data is looked for when ``$MODECONN_DATA`` is not set, as ``(origin, parent directory)``: the
    ``shared/data`` folder beside the source checkout (the layout the README and ``make`` use), then
    ``../shared/data`` relative to the working directory; duplicates dropped."""
    out: list[tuple[str, Path]] = []
    checkout = source_checkout()
    if checkout is not None:
        out.append(("beside the checkout", checkout.parent / DEFAULT_DATA))
    out.append(("../shared/data from the working directory", (Path.cwd().parent / DEFAULT_DATA).resolve()))
    seen: set[Path] = set()
    return [(o, p) for o, p in out if not (p in seen or seen.add(p))]


def _layout(name: str) -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ConfigError(
            f"dataset {name!r} is not read from a directory; file-backed datasets: {', '.join(LAYOUTS)}"
        ) from None


def idx_file(directory: Path, stem: str) -> Path | None:
    """``directory/stem`` or ``directory/stem.gz``, whichever exists (uncompressed first), else None."""
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _needed(layout: Layout) -> list[str]:
    return [f"{s}[.gz]" for s in layout.files] if layout.idx else list(layout.files)


def expected_layout(name: str) -> str:
    """``"mnist/ (train-images-idx3-ubyte[.gz], …)"``: the usual sub-directory of dataset ``name`` in a data directory
    such as ``$MODECONN_DATA``, and the files it must hold."""
    layout = _layout(name)
    return f"{layout.subdirs[0]}/ ({', '.join(_needed(layout))})"


def missing_files(directory: Path, layout: Layout) -> list[str]:
    """Names of the required files absent from ``directory``."""
    if layout.idx:
        return [f"{s}[.gz]" for s in layout.files if idx_file(directory, s) is None]
    return [f for f in layout.files if not (directory / f).is_file()]


def _candidates(name: str, layout: Layout, root: Path | None) -> list[tuple[str, Path]]:
    if root is not None:
        return [("root", root)] + [("root", root / s) for s in layout.subdirs]
    out: list[tuple[str, Path]] = []
    env = os.environ.get(ENV_VAR)
    parents = [(f"${ENV_VAR}", Path(env).expanduser())] if env else [(f"${ENV_VAR} unset: {o}", p) for o, p in default_data_roots()]
    out += [(origin, parent / s) for origin, parent in parents for s in layout.subdirs]
    out += [("system", Path(d)) for d in layout.system_dirs]
    out.append(("cache", cache_dir() / name))
    return out


def find_data_dir(name: str, root: str | os.PathLike | None = None, *, download: bool | None = None) -> Path:
    """The directory holding dataset ``name`` ("mnist", "fashion-mnist", "cifar10", "cifar100", "austen").

    See the module docstring for the search order. With ``download=True`` a missing MNIST/Fashion-MNIST
    is downloaded (SHA-256 verified) and its directory returned; ``None`` follows :func:`downloads_allowed`.

    Raises:
        ConfigError: ``name`` is not a file-backed dataset.
        DataError: not found; the message lists every directory looked at (and what was missing there)
            and how to provide the data. Download failures also raise DataError.
    """
    layout = _layout(name)
    root_path = None if root is None else Path(root).expanduser()
    looked: list[str] = []
    for origin, directory in _candidates(name, layout, root_path):
        if not directory.is_dir():
            looked.append(f"  {directory} ({origin}): no such directory")
            continue
        missing = missing_files(directory, layout)
        if not missing:
            return directory
        looked.append(f"  {directory} ({origin}): missing {', '.join(missing)}")
    if download is None:
        download = _DOWNLOAD.get()
    if download and layout.downloadable:
        from .download import download_idx

        dest = (root_path / layout.subdirs[0]) if root_path is not None else cache_dir() / name
        return download_idx(name, dest)
    if root_path is None and not os.environ.get(ENV_VAR):
        looked.insert(0, f"  ${ENV_VAR} is not set (default: {DEFAULT_DATA} beside the checkout, ../{DEFAULT_DATA} "
                         "from the working directory)")
    how = [f"set {ENV_VAR} to a directory containing {layout.subdirs[0]}/",
           "pass the directory as root= (or --data on the command line)"]
    if layout.downloadable:
        how.append("pass download=True (or --download on the command line) to fetch it (SHA-256 verified)")
    raise DataError(
        f"dataset {name!r} not found; looked in:\n" + "\n".join(looked)
        + f"\nNeeded files: {', '.join(_needed(layout))}."
        + "\nTo provide it: " + "; or ".join(how) + "."
    )

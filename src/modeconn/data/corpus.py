"""Reading the user's text corpus through the ``datasets`` library's local loaders.

Formats (by suffix; a directory is one written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``):

========================== ======================================= =======================================
input                      read with                               one document is
========================== ======================================= =======================================
``.txt``                   ``load_dataset("text", sample_by=        the whole file
                           "document")``
``.jsonl`` / ``.json``     ``load_dataset("json")``                one record's ``text_field``
``.csv``                   ``load_dataset("csv")``                 one row's ``text_field``
``.parquet``               ``load_dataset("parquet")``             one row's ``text_field``
a ``save_to_disk`` dir     ``datasets.load_from_disk``             one row's ``text_field``
========================== ======================================= =======================================

Only local files are read (``HF_DATASETS_OFFLINE``); the builders' Arrow cache goes to a temporary directory that is
removed afterwards — nothing is written beside the user's file. Text files must be UTF-8.
"""

from __future__ import annotations

import codecs
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError

#: Builder of ``datasets.load_dataset`` per file suffix.
BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
_TEXT_ENCODED = {"text", "json", "csv"}
_SAVED_MARKERS = ("dataset_dict.json", "state.json")
Rows = tuple[list[str], "list[Any] | None"]
"""The texts of a part of a corpus and their labels (None: read without labels)."""


@dataclass(frozen=True)
class Corpus:
    """The documents of the user's corpus: ``train`` and, when the user gave one, ``heldout`` (else None);
    ``heldout_source`` says where the held-out documents came from. Read with a label field, ``train_labels`` and
    ``heldout_labels`` hold each document's label (as stored: int or str), else None."""

    train: list[str]
    heldout: list[str] | None
    source: str
    heldout_source: str | None = None
    train_labels: list[Any] | None = None
    heldout_labels: list[Any] | None = None


def is_saved_dataset(path: Path) -> bool:
    """True for a directory written by ``save_to_disk``."""
    return path.is_dir() and any((path / m).is_file() for m in _SAVED_MARKERS)


def is_text_corpus(path: Path) -> bool:
    """True for a file of a suffix in :data:`BUILDERS` or a ``save_to_disk`` directory."""
    return (path.is_file() and path.suffix.lower() in BUILDERS) or is_saved_dataset(path)


def _datasets():
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only; read when datasets is first imported
    import datasets

    datasets.disable_progress_bars()
    return datasets


def check_utf8(path: Path) -> None:
    """DataError naming ``path`` when it is empty or not UTF-8 (decoded incrementally, 1 MiB at a time)."""
    if path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty")
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as err:
                raise DataError(f"{path}: not UTF-8 text (byte {offset + err.start}: {err.reason}); text corpora are "
                                "read as UTF-8 — re-save the file with that encoding") from None
            offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (truncated at the end: {err.reason}); text corpora are read as UTF-8") \
            from None


def _load_file(path: Path) -> Any:
    builder = BUILDERS[path.suffix.lower()]
    if builder in _TEXT_ENCODED:
        check_utf8(path)
    elif path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty")
    extra = {"sample_by": "document"} if builder == "text" else {}
    datasets = _datasets()
    with tempfile.TemporaryDirectory(prefix="modeconn-datasets-") as cache:
        try:
            ds = datasets.load_dataset(builder, data_files={"train": str(path.resolve())}, cache_dir=cache,
                                       split="train", keep_in_memory=True, **extra)
        except Exception as err:  # the builders raise many types (ArrowInvalid, DatasetGenerationError, …)
            cause = err.__cause__ or err
            raise DataError(f"{path}: cannot be read as {builder} ({type(cause).__name__}: {cause})") from None
    return ds


def _column(ds: Any, field: str, where: str, option: str) -> list[Any]:
    if field not in ds.column_names:
        raise DataError(f"{where}: no field {field!r} (fields present: {', '.join(ds.column_names) or 'none'}); name the "
                        f"field with {option}")
    return list(ds[field])


def _rows(ds: Any, field: str, where: str, label_field: str | None = None) -> Rows:
    """The non-empty strings of column ``field`` and, with ``label_field``, the label of each (rows whose text is empty
    are dropped with their label); DataError naming the field, ``where`` and the fields present, a field holding no
    text, or a missing label (None, NaN) naming its row."""
    values = _column(ds, field, where, "--text-field")
    bad = next((v for v in values if v is not None and not isinstance(v, str)), None)
    if bad is not None:
        raise DataError(f"{where}: field {field!r} holds {type(bad).__name__} values, not text")
    keep = [i for i, v in enumerate(values) if v]
    if not keep:
        raise DataError(f"{where}: field {field!r} holds no text")
    if label_field is None:
        return [values[i] for i in keep], None
    labels = _column(ds, label_field, where, "--label-field")
    missing = next((i for i in keep if labels[i] is None or labels[i] != labels[i]), None)  # None or NaN
    if missing is not None:
        raise DataError(f"{where}: row {missing} has no {label_field!r} (a label is needed for every text)")
    return [values[i] for i in keep], [labels[i] for i in keep]


def _saved_splits(path: Path, field: str, split: str | None, label_field: str | None) -> Corpus:
    datasets = _datasets()
    try:
        saved = datasets.load_from_disk(str(path), keep_in_memory=True)
    except Exception as err:
        raise DataError(f"{path}: not a readable save_to_disk directory ({type(err).__name__}: {err})") from None
    if isinstance(saved, datasets.Dataset):
        if split is not None:
            raise DataError(f"{path}: a single saved Dataset has no splits, so --split {split!r} names none; leave "
                            "--split out (a seeded share is held out) or save a DatasetDict")
        return _corpus(_rows(saved, field, str(path), label_field), None, str(path))
    names = list(saved.keys())
    train = "train" if "train" in saved else (names[0] if len(names) == 1 else None)
    if train is None:
        raise DataError(f"{path}: no 'train' split to evaluate on (splits present: {', '.join(names)})")
    if split is not None and split not in saved:
        raise DataError(f"{path}: no split {split!r} (splits present: {', '.join(names)})")
    heldout = _rows(saved[split], field, f"{path} split {split!r}", label_field) if split is not None else None
    return _corpus(_rows(saved[train], field, f"{path} split {train!r}", label_field), heldout,
                   f"{path} split {train!r}", f"split {split!r}" if split is not None else None)


def _corpus(train: Rows, heldout: Rows | None, source: str, heldout_source: str | None = None) -> Corpus:
    """A :class:`Corpus` from :func:`_rows` results (texts and labels) of the training and held-out parts."""
    return Corpus(train[0], None if heldout is None else heldout[0], source, heldout_source, train[1],
                  None if heldout is None else heldout[1])


def read_corpus(path: str | os.PathLike, *, text_field: str = "text", split: str | None = None,
                label_field: str | None = None) -> Corpus:
    """The documents of the corpus at ``path`` (module docstring) and the user's held-out documents, if any.

    Args:
        text_field: the column holding the text (``.txt`` files have the one column ``text``).
        split: the held-out part: a split of a ``save_to_disk`` DatasetDict, or a second file of a supported format;
            None: no held-out documents (the caller holds out a seeded share).
        label_field: the column holding each document's label (text classification); None: no labels read.

    Raises:
        DataError: empty or non-UTF-8 file, unsupported suffix, a missing field (named, with the file and the fields
            present), a field holding no text, a row without a label, a split that does not exist (the splits present
            named), labels asked of a ``.txt`` file.
    """
    path = Path(path)
    if label_field is not None and path.suffix.lower() == ".txt":
        raise DataError(f"{path}: a .txt file holds text only; labelled text is a .jsonl/.json/.csv/.parquet file or "
                        f"a saved dataset with a {label_field!r} field")
    field = "text" if path.suffix.lower() == ".txt" else text_field
    if is_saved_dataset(path):
        return _saved_splits(path, field, split, label_field)
    if not is_text_corpus(path):
        raise DataError(f"{path}: not a text corpus modeconn reads (files {', '.join(BUILDERS)}, or a directory "
                        "written by datasets' save_to_disk)")
    train = _rows(_load_file(path), field, str(path), label_field)
    if split is None:
        return _corpus(train, None, str(path))
    second = Path(split).expanduser()
    if not (second.is_file() and second.suffix.lower() in BUILDERS):
        raise DataError(f"{path}: --split {split!r} names no split: a single file has none; give a second file "
                        f"({', '.join(BUILDERS)}) as the held-out part, or leave --split out")
    heldout = _rows(_load_file(second), "text" if second.suffix.lower() == ".txt" else text_field, str(second),
                    label_field)
    return _corpus(train, heldout, str(path), str(second))

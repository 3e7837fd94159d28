"""The output vocabulary of a merge whose recipe has tokenizer keys (:mod:`modeconn.recipes.merge_tokenizer`), built
as mergekit 0.1.5 builds it, and the rows of every model's embedding and LM head in it.

* **Vocabulary.** ``base``: the base model's tokenizer (else the first model's); a model: that model's; ``union``:
  the base's, then every other token of the models (base first, then the recipe's order; a model's tokens in id
  order) added as a token, then the models' added tokens (special or not) with their settings (the first model's
  where two differ). Tokens of ``tokenizer.tokens`` missing from it are added last. The tokenizer is loaded and
  written with transformers (``save_pretrained``), so its files are the ones mergekit writes; ``config.json``'s
  ``vocab_size`` becomes the vocabulary's size rounded up to ``pad_to_multiple_of``.
* **Rows.** Each model's token-indexed tensors (the input embeddings and the output embeddings, as the model class
  names them; token axis first) are permuted into the new numbering
  (:class:`~modeconn.io.vocab_rows.RowGathered`); a token a model lacks takes, in order: the source
  ``tokenizer.tokens`` gives it; the row of the only model that has it; the base model's row; the mean of the
  models that have it (in the recipe's order, in the inputs' dtype); zeros where no model has it. ``force: true``
  gives every model the source's row. Padding rows are the mean of the real rows. Then the merge rule runs as on
  any tensor.
* **Chat template.** A name of mergekit's built-in templates (read from the installed mergekit package), ``auto``
  (the template most models have) or Jinja text (at least 20 characters, with ``{``), set on the output tokenizer
  and written by ``save_pretrained`` (``chat_template.jinja`` with the transformers installed here). With only
  ``chat_template``, the base's tokenizer is written with it and the rows stay as they are.

Where mergekit's result depends on hash order (tokens new to the base from two or more models, or a merge without
``base_model`` whose models' vocabularies differ) modeconn's order above is the deterministic one. With ``align:
weight`` the models are aligned first (the permutation acts on the hidden axis, the vocabulary on the token axis: the
two commute), weight matching sees each model's rows of the output vocabulary (zeros for tokens it lacks, which add
nothing to its objective), and every row above is taken from aligned tensors.

Refused, naming the key and model: a model without tokenizer files; a tokenizer with token ids past the model's
``vocab_size`` (mergekit strips them); a token source naming a token the model lacks; a ``tokens`` entry without a
source for a token some model lacks (mergekit fails there); a ``model_token`` source with ``align: weight`` (the
stored row is outside the vocabulary the alignment sees).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..io import CONFIG_NAME
from ..io.safe import read_json_object
from ..io.vocab_rows import RowGathered
from .merge_tokenizer import TokenizerRecipe, TokenRule, TokenSource

TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer.model",
                   "added_tokens.json", "merges.txt", "vocab.json", "vocab.txt", "chat_template.jinja",
                   "chat_template.json")
"""Tokenizer files of the base not carried to an output whose tokenizer is written anew."""

Fill = Callable[[str, list[torch.Tensor]], list[torch.Tensor]]


@dataclass
class Vocabulary:
    """The output tokenizer of a merge and each model's rows in it: ``size`` tokens, ``rows`` (padded), ``perms``
    (per model, new id → its id or -1), ``defaults`` (new id → the :class:`TokenSource` of the row a model lacking
    it takes; ``None``: the mean of the models that have it), ``forced`` (ids every model takes the default of),
    ``files`` (tokenizer file name → bytes) and ``remap`` (False: only the tokenizer files change)."""

    files: dict[str, bytes]
    size: int = 0
    rows: int = 0
    perms: list[torch.Tensor] = field(default_factory=list)
    defaults: dict[int, TokenSource | None] = field(default_factory=dict)
    forced: frozenset[int] = frozenset()
    originals: list[dict[str, int]] = field(default_factory=list)
    dtype: torch.dtype | None = None
    remap: bool = True

    def views(self, ckpts: list, keys: Sequence[str]) -> list[RowGathered]:
        """The checkpoints with their token-indexed tensors ``keys`` in the output vocabulary."""
        return [RowGathered(c, keys, p, self.rows) for c, p in zip(ckpts, self.perms, strict=True)]

    def filler(self, views: list[RowGathered]) -> Fill:
        """``fill(key, tensors)``: the models' (aligned) tensors of ``key`` read from ``views`` with the rows of the
        tokens each lacks and the padding rows filled in (cast to the recipe's dtype first); others as given."""
        keys = views[0].gathered

        def fill(key: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
            if key not in keys:
                return tensors
            if self.dtype is not None:
                tensors = [t.to(self.dtype) for t in tensors]
            dtype = tensors[0].dtype
            for t in tensors[1:]:
                dtype = torch.promote_types(dtype, t.dtype)
            tensors = [t.to(dtype) for t in tensors]
            rows = {i: self._default(i, src, key, tensors, views) for i, src in self.defaults.items()}
            for m, t in enumerate(tensors):
                for i, row in rows.items():
                    if self.perms[m][i] < 0 or i in self.forced:
                        t[i] = row
                if self.rows > self.size:
                    t[self.size:] = torch.mean(t[:self.size], dim=0)
            return tensors

        return fill

    def _default(self, i: int, src: TokenSource | None, key: str, tensors: list[torch.Tensor],
                 views: list[RowGathered]) -> torch.Tensor:
        if src is None:
            acc, count = torch.zeros(tensors[0].shape[1:], dtype=tensors[0].dtype), 0
            for m, t in enumerate(tensors):
                if self.perms[m][i] >= 0:
                    acc = acc + t[i]
                    count += 1
            acc /= count
            return acc
        if src.kind == "zero":
            return tensors[0].new_zeros(tensors[0].shape[1:])
        if src.kind == "model":
            return tensors[src.model][i]
        row = src.token_id if src.token_id is not None else self.originals[src.model][src.token]
        stored = views[src.model].source.read_rows(key, row, 1)[0]
        return stored if self.dtype is None else stored.to(self.dtype)

    def side_files(self, side: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        """``side`` (the files carried to the output) with the base's tokenizer files replaced by the new ones, and
        ``config`` (the output's config.json) with its vocabulary size where the vocabulary changed."""
        out = {k: v for k, v in side.items() if k not in TOKENIZER_FILES}
        out.update(self.files)
        if self.remap:
            out[CONFIG_NAME] = _with_vocab_size(config, self.rows)
        return out


def _with_vocab_size(config: dict[str, Any], n: int) -> dict[str, Any]:
    text = config.get("text_config")
    if "vocab_size" not in config and isinstance(text, dict):
        return {**config, "text_config": {**text, "vocab_size": n}}
    return {**config, "vocab_size": n}


def plan_vocabulary(tok: TokenizerRecipe, paths: Sequence[Path], base: int | None, *, aligned: bool,
                    dtype: torch.dtype | None = None, where: str = "recipe") -> Vocabulary:
    """The :class:`Vocabulary` of a merge of ``paths`` (``base``: the base's index) by recipe keys ``tok``; ``aligned``:
    the models are aligned first; ``dtype``: the recipe's. Reads the tokenizers and configs only. ConfigError naming
    the key and the model at fault (module docstring)."""
    donor = 0 if base is None else base
    toks = [_tokenizer(p, where) for p in paths]
    sizes = [_vocab_size(p, t) for p, t in zip(paths, toks, strict=True)]
    if tok.source is None:  # chat_template alone: the donor's tokenizer with it
        _set_template(toks[donor], tok.chat_template, toks, where)
        return Vocabulary(files=_saved(toks[donor]), remap=False)
    for p, t, n in zip(paths, toks, sizes, strict=True):
        _check_fits(t, n, p, where)
    if aligned:
        bad = next((t for t, r in tok.tokens.items() if r.source is not None and r.source.kind == "model_token"), None)
        if bad is not None:
            raise ConfigError(f"{where}: tokenizer.tokens[{bad!r}].source: a model_token row is a stored row outside "
                              "the output vocabulary, which align: weight does not align; use align: none or a model "
                              "as the source")
    out = _output_tokenizer(tok, toks, donor, paths, where)
    for t in tok.tokens:
        if t not in out.get_vocab():
            out.add_tokens(t)
    vocab = out.get_vocab()
    size = len(vocab)
    pad = tok.pad_to_multiple_of
    rows = size if not pad or size % pad == 0 else (size // pad + 1) * pad
    originals = [t.get_vocab() for t in toks]
    perms = [_perm(vocab, o, size, n) for o, n in zip(originals, sizes, strict=True)]
    defaults, forced = _defaults(tok.tokens, vocab, perms, base, originals, sizes, paths, where)
    _set_template(out, tok.chat_template, toks, where)
    return Vocabulary(_saved(out), size, rows, perms, defaults, forced, originals, dtype)


def _tokenizer(path: Path, where: str):
    from transformers import AutoTokenizer

    try:
        # a local directory (never a hub id); no local_files_only: transformers writes it into tokenizer_config.json
        if not Path(path).is_dir():
            raise OSError(f"{path} is not a directory")
        return AutoTokenizer.from_pretrained(str(path), use_fast=True, trust_remote_code=False)
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise ConfigError(f"{where}: the tokenizer keys need each model's tokenizer; {path} has none that loads "
                          f"({type(err).__name__}: {err})") from None


def _vocab_size(path: Path, tok) -> int:
    cfg = read_json_object(Path(path) / CONFIG_NAME, "config file")
    text = cfg.get("text_config")
    n = cfg.get("vocab_size", text.get("vocab_size") if isinstance(text, dict) else None)
    return n if isinstance(n, int) and not isinstance(n, bool) else len(tok.get_vocab())


def _check_fits(tok, n: int, path: Path, where: str) -> None:
    past = sorted(i for i in tok.get_vocab().values() if i >= n)
    if past:
        raise ConfigError(f"{where}: the tokenizer of {path} has {len(past)} token id(s) ≥ its config's vocab_size {n} "
                          f"(e.g. {past[0]}): tokens without embedding rows are not supported (strip them from the "
                          "tokenizer)")


def _output_tokenizer(tok: TokenizerRecipe, toks: list, donor: int, paths: Sequence[Path], where: str):
    if tok.source == "base":  # the base's own (tokens added to it count as the base's, as in mergekit)
        return toks[donor]
    if tok.source != "union":
        return _tokenizer(paths[tok.source], where)
    out = _reloaded(toks[donor])
    order = [donor] + [m for m in range(len(toks)) if m != donor]
    added: dict[str, Any] = {}
    for m in order:
        for i, info in sorted(toks[m].added_tokens_decoder.items()):
            added.setdefault(info.content, info)
    known = set(toks[donor].get_vocab())
    for m in order:
        for t, _ in sorted(toks[m].get_vocab().items(), key=lambda e: e[1]):
            if t not in known and t not in added:
                out.add_tokens(t)
            known.add(t)
    for info in added.values():
        out.add_tokens(info)
    return out


def _reloaded(tok):
    """A fresh copy of ``tok`` (written and read back), so that adding tokens leaves the model's own untouched."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as d:
        tok.save_pretrained(d, legacy_format=False, safe_serialization=True)
        return AutoTokenizer.from_pretrained(d, use_fast=True, trust_remote_code=False)


def _perm(vocab: dict[str, int], own: dict[str, int], size: int, rows: int) -> torch.Tensor:
    """New id → the model's id of the token (-1 where it lacks it or its id has no row of the ``rows``)."""
    p = torch.full((size,), -1, dtype=torch.long)
    for t, i in vocab.items():
        if own.get(t, rows) < rows:
            p[i] = own[t]
    return p


def _defaults(rules: dict[str, TokenRule], vocab: dict[str, int], perms: list[torch.Tensor], base: int | None,
              originals: list[dict[str, int]], sizes: list[int], paths: Sequence[Path], where: str):
    """New id → the source of the row a model lacking the token takes (None: the mean), for the ids some model
    lacks or a rule forces; and the forced ids."""
    defaults: dict[int, TokenSource | None] = {}
    forced = set()
    for t, i in vocab.items():
        present = [m for m, p in enumerate(perms) if p[i] >= 0]
        rule = rules.get(t)
        if rule is not None and rule.force:
            forced.add(i)
        elif len(present) == len(perms):
            continue
        if rule is not None:
            defaults[i] = _checked_source(t, i, rule.source, perms, originals, sizes, paths, where)
        elif len(present) == 1:
            defaults[i] = TokenSource("model", present[0])
        elif not present:
            defaults[i] = TokenSource("zero")
        else:
            defaults[i] = TokenSource("model", base) if base is not None and base in present else None
    return defaults, frozenset(forced)


def _checked_source(t: str, i: int, src: TokenSource | None, perms, originals, sizes, paths, where: str):
    key = f"{where}: tokenizer.tokens[{t!r}]"
    if src is None:
        lacking = next(paths[m] for m, p in enumerate(perms) if p[i] < 0) if any(p[i] < 0 for p in perms) else None
        raise ConfigError(f"{key} has no source, and {lacking or 'force: true'} needs one "
                          "(give source: a model, {kind: zero} or {kind: model_token, ...})")
    if src.kind == "model" and perms[src.model][i] < 0:
        raise ConfigError(f"{key}.source: {paths[src.model]} does not have the token")
    if src.kind == "model_token":
        if src.token is not None and src.token not in originals[src.model]:
            raise ConfigError(f"{key}.source.token {src.token!r}: not in the vocabulary of {paths[src.model]}")
        if src.token_id is not None and src.token_id >= sizes[src.model]:
            raise ConfigError(f"{key}.source.token_id {src.token_id}: {paths[src.model]} has "
                              f"{sizes[src.model]} rows")
    return src


def _set_template(tok, template: str | None, toks: list, where: str) -> None:
    if template is None:
        return
    if template == "auto":
        found = [t.chat_template.get("default") if isinstance(t.chat_template, dict) else t.chat_template
                 for t in toks]
        found = [f.strip() for f in found if f]
        if not found:
            return
        template = Counter(found).most_common(1)[0][0]
    elif len(template) < 256 and "\n" not in template and "{" not in template:
        template = _builtin_template(template, where)
    elif len(template) < 20 or "{" not in template:
        raise ConfigError(f"{where}: chat_template {template!r}: neither a template name nor Jinja text")
    tok.chat_template = template


def _builtin_template(name: str, where: str) -> str:
    from importlib import resources

    try:
        file = resources.files("mergekit._data.chat_templates").joinpath(name + ".jinja")
    except ModuleNotFoundError:
        raise ConfigError(f"{where}: chat_template {name!r}: template names are mergekit's built-in templates "
                          "(install mergekit), or give the template's Jinja text") from None
    if not file.is_file():
        names = sorted(p.name.removesuffix(".jinja") for p in file.parent.iterdir() if p.name.endswith(".jinja"))
        raise ConfigError(f"{where}: chat_template {name!r} is not a built-in template ({', '.join(names)}, auto) "
                          "nor Jinja text")
    return file.read_text()


def _saved(tok) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as d:
        tok.save_pretrained(d, safe_serialization=True)
        return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir()) if p.is_file()}

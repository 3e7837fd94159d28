"""The tokenizer keys of a merge recipe (mergekit's schema): ``tokenizer_source``, the ``tokenizer`` section and
``chat_template`` — parsed and checked before any checkpoint is read, recorded, and written back into the recipe a
merge writes::

    tokenizer_source: union          # union | base | a model of the recipe: the output's vocabulary
    tokenizer:                       # instead of tokenizer_source (not both)
      source: union                  #   as tokenizer_source (default: union)
      tokens:                        #   tokens added to the vocabulary if missing, and where their rows come from
        <|im_start|>:
          source: ./b                #     a model: its row of this token
          force: true                #     every model takes that row, also those that have the token
        <|tool|>: {source: {kind: model_token, model: ./a, token: "<s>"}}   # a model's row of another token
        <|pad|>: {source: {kind: zero}}                                       # zeros
      pad_to_multiple_of: 64         #   rows padded (with the mean row) to a multiple
    chat_template: chatml            # a template name of mergekit's (chatml, llama3 …), auto, or the Jinja text

Without any of them the base model's tokenizer files (else the first model's) are copied as they are. What the keys
build — the vocabulary, each model's embedding and LM-head rows permuted into it, the rows of missing tokens — is
:mod:`modeconn.recipes.merge_vocab`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

KEYS = ("tokenizer_source", "tokenizer", "chat_template")
SECTION_KEYS = ("source", "tokens", "pad_to_multiple_of")
TOKEN_KEYS = ("source", "force")


@dataclass(frozen=True)
class TokenSource:
    """Where a token's row comes from: ``kind`` ``"model"`` (model ``model``'s row of the token itself),
    ``"model_token"`` (model ``model``'s stored row ``token_id``, or of the token ``token``) or ``"zero"``."""

    kind: str
    model: int | None = None
    token: str | None = None
    token_id: int | None = None


@dataclass(frozen=True)
class TokenRule:
    """One entry of ``tokenizer.tokens``: its ``source`` (None: the default one) and ``force``."""

    source: TokenSource | None = None
    force: bool = False


@dataclass(frozen=True)
class TokenizerRecipe:
    """The tokenizer keys of a recipe: ``source`` (``"union"``, ``"base"``, a model's index, or None: the base's
    tokenizer copied), ``tokens`` (token → :class:`TokenRule`, in the recipe's order), ``pad_to_multiple_of``,
    ``chat_template`` (as written) and ``section`` (given as a ``tokenizer:`` section)."""

    source: str | int | None
    tokens: dict[str, TokenRule] = field(default_factory=dict)
    pad_to_multiple_of: int | None = None
    chat_template: str | None = None
    section: bool = False


def parse_tokenizer(raw: dict[str, Any], refs: list[str], file: Path) -> TokenizerRecipe | None:
    """The tokenizer keys of recipe ``raw`` (None when it has none); model references are matched against ``refs``
    (the recipe's models as written, base included). ConfigError naming the key and why."""
    if not any(k in raw for k in KEYS):
        return None
    if "tokenizer_source" in raw and "tokenizer" in raw:
        raise ConfigError(f"{file}: tokenizer_source and tokenizer: give one (tokenizer.source is the "
                          "tokenizer_source of the section)")
    template = raw.get("chat_template")
    if template is not None and (not isinstance(template, str) or not template):
        raise ConfigError(f"{file}: chat_template must be a template name or the template's Jinja text, got "
                          f"{template!r}")
    section = raw.get("tokenizer")
    if section is None:
        source = raw.get("tokenizer_source")
        return TokenizerRecipe(None if source is None else _source(source, refs, file, "tokenizer_source"),
                               chat_template=template)
    if not isinstance(section, dict) or any(k not in SECTION_KEYS for k in section):
        bad = next((k for k in section if k not in SECTION_KEYS), None) if isinstance(section, dict) else None
        raise ConfigError(f"{file}: tokenizer{'.' + str(bad) if bad else ''}: the tokenizer section takes "
                          f"{', '.join(SECTION_KEYS)}")
    tokens = section.get("tokens") or {}
    if not isinstance(tokens, dict) or not all(isinstance(t, str) and t for t in tokens):
        raise ConfigError(f"{file}: tokenizer.tokens must map tokens (strings) to {{source: ..., force: ...}}")
    pad = section.get("pad_to_multiple_of")
    if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or pad < 1):
        raise ConfigError(f"{file}: tokenizer.pad_to_multiple_of must be a positive integer, got {pad!r}")
    return TokenizerRecipe(_source(section.get("source", "union"), refs, file, "tokenizer.source"),
                           {t: _token_rule(v, refs, file, f"tokenizer.tokens[{t!r}]") for t, v in tokens.items()},
                           pad, template, section=True)


def _model(ref: Any, refs: list[str], file: Path, where: str) -> int:
    if not isinstance(ref, str) or ref not in refs:
        raise ConfigError(f"{file}: {where} {ref!r} is not one of the recipe's models {refs} (a tokenizer or row "
                          "from outside the merge is not supported)")
    return refs.index(ref)


def _source(value: Any, refs: list[str], file: Path, where: str) -> str | int:
    return value if value in ("union", "base") else _model(value, refs, file, where)


def _token_rule(value: Any, refs: list[str], file: Path, where: str) -> TokenRule:
    value = {} if value is None else value
    if not isinstance(value, dict) or any(k not in TOKEN_KEYS for k in value):
        raise ConfigError(f"{file}: {where} takes {', '.join(TOKEN_KEYS)}, got {value!r}")
    force = value.get("force", False)
    if not isinstance(force, bool):
        raise ConfigError(f"{file}: {where}.force must be true or false, got {force!r}")
    source = value.get("source")
    if source is None:
        return TokenRule(None, force)
    if not isinstance(source, dict):
        return TokenRule(TokenSource("model", _model(source, refs, file, f"{where}.source")), force)
    kind = source.get("kind")
    if kind == "zero" and set(source) == {"kind"}:
        return TokenRule(TokenSource("zero"), force)
    given = [k for k in ("token", "token_id") if source.get(k) is not None]
    if kind != "model_token" or set(source) - {"kind", "model", "token", "token_id"} or len(given) != 1:
        raise ConfigError(f"{file}: {where}.source must be a model, {{kind: zero}} or {{kind: model_token, model: "
                          f"..., token: ... | token_id: ...}} (one of token, token_id), got {source!r}")
    token_id = source.get("token_id")
    if token_id is not None and (isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0):
        raise ConfigError(f"{file}: {where}.source.token_id must be a token id (an integer ≥ 0), got {token_id!r}")
    return TokenRule(TokenSource("model_token", _model(source.get("model"), refs, file, f"{where}.source.model"),
                                 source.get("token"), token_id), force)


def tokenizer_record(tok: TokenizerRecipe | None, names: list[str]) -> dict[str, Any] | None:
    """``tok`` for a merge's record (``merge.json``), models by their names."""
    if tok is None:
        return None

    def model(i):
        return {"model": names[i]}

    def source(s: TokenSource | None):
        if s is None or s.kind == "zero":
            return None if s is None else {"kind": "zero"}
        extra = {k: v for k, v in (("token", s.token), ("token_id", s.token_id)) if v is not None}
        return {**model(s.model), **({"kind": "model_token", **extra} if s.kind == "model_token" else {})}

    return {"source": tok.source if isinstance(tok.source, str) or tok.source is None else model(tok.source),
            "tokens": {t: {"source": source(r.source), "force": r.force} for t, r in tok.tokens.items()},
            "pad_to_multiple_of": tok.pad_to_multiple_of, "chat_template": tok.chat_template, "section": tok.section}


def tokenizer_keys(rec: dict[str, Any] | None, names: list[str], refs: list[str]) -> dict[str, Any]:
    """The recipe keys of a record made by :func:`tokenizer_record` (models named by ``refs``, matched by their
    ``names``), as the recipe gave them (a section, or ``tokenizer_source``)."""
    if not rec:
        return {}

    def ref(v):
        return refs[names.index(v["model"])] if isinstance(v, dict) and "model" in v else v

    def source(s):
        if s is None or "kind" not in s or s["kind"] == "zero":
            return ref(s)
        return {"kind": "model_token", "model": ref(s), **{k: s[k] for k in ("token", "token_id") if k in s}}

    out: dict[str, Any] = {}
    if rec["section"]:
        tokens = {t: {**({"source": source(r["source"])} if r["source"] is not None else {}),
                      **({"force": True} if r["force"] else {})} for t, r in rec["tokens"].items()}
        out["tokenizer"] = {"source": ref(rec["source"]), **({"tokens": tokens} if tokens else {}),
                            **({"pad_to_multiple_of": rec["pad_to_multiple_of"]} if rec["pad_to_multiple_of"] else {})}
    elif rec["source"] is not None:
        out["tokenizer_source"] = ref(rec["source"])
    if rec["chat_template"] is not None:
        out["chat_template"] = rec["chat_template"]
    return out

"""Dense → Mixture-of-Experts: N dense Hugging Face causal LMs of one family become one MoE checkpoint.

    from modeconn import dense_to_moe

    dense_to_moe(["llama-law", "llama-fiction"], "moe", data=[law_blocks, fiction_blocks], router_steps=200)

Every model is aligned to the first by weight matching: by default with the full transformer group after
normalization absorption (a residual rotation, per-head orthogonal maps, FFN permutations) as ``modeconn align
--groups full`` matches it — every model absorbed tensor by tensor from its checkpoint, no model loaded — the aligned
models read as stock models of their family (norm weights one, head untied), which RMSNorm families can hold; else, or
with ``align="weight"``, by streaming weight matching with permutations (residual stream, attention heads' dimensions,
FFN hidden units); ``align="none"`` takes them as stored. The aligned tensors are computed from the checkpoints when
they are read, never kept: memory holds the two models being matched (full group, fp32), one dense model at a time
for the router statistics, and the MoE itself. The shared parts (embeddings, attention, norms, head) are
averaged; model ``i``'s FFN becomes expert ``i`` of every layer, in the matching MoE family (:data:`MOE_FAMILIES`:
Llama and Mistral → Mixtral, Qwen2 → Qwen2-MoE, whose shared expert is written as a zero expert of one hidden unit:
the dense models have none).

The router is initialised from data, in the spirit of Branch-Train-MiX (Sukhbaatar et al. 2024): in each layer, the
input of each aligned dense model's FFN (its post-attention norm's output) is averaged over its own data, and the
router row of expert ``i`` is the centred mean ``(m_i − m̄) / σ²`` (σ²: the pooled per-coordinate variance) — the
nearest-mean classifier of spherical Gaussians. ``router_steps`` then trains the router rows alone (AdamW, the
language-model loss, batches drawn from every model's data), and ``shared_steps`` the router with every averaged
tensor (embeddings, attention, norms, head), the experts frozen: the averaged parts of models that share no
initialisation are what an MoE of them loses most on (Branch-Train-MiX fine-tunes the whole MoE after mixing; here each
expert stays its dense model's FFN). Top-k weights are renormalised to sum to one, so N copies of one dense model give
an MoE computing exactly that model, whatever the router.

The output is written atomically (config.json, safetensors, the first model's tokenizer files, ``moe.json``: the
inputs, alignment objectives, router settings), loads with ``from_pretrained`` and ``generate``s. Every check (family,
same configs and vocabularies, weights complete, ``out`` not an input and writable, one data block per model) runs
before any weights are read.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ._util.jsonio import write_json
from ._util.outdir import output_directory
from .errors import ConfigError, NonFiniteError
from .io.hf import copy_code_free_side_files, model_names
from .io.safe import read_json_object
from .match.weight import WeightMatchingConfig, align_to_first
from .registry import Registry
from .symmetry.hf.config_check import config_class

PathLike = str | os.PathLike
Log = Callable[[str], None]
FFN = re.compile(r"^(?P<layer>(?:model\.)?layers\.(?P<index>\d+))\.mlp\.(?P<proj>gate|up|down)_proj\.weight$")
"""A dense FFN tensor of the Llama-layout tables: the layer's prefix, its index and the projection."""


@dataclass(frozen=True)
class MoEFamily:
    """The MoE counterpart of a dense family: its ``model_type``, the MoE config's own fields for ``experts`` experts
    of which ``top_k`` are active, and per layer the tensors the MoE has beyond experts and router
    (``extra(config, prefix)``)."""

    moe_type: str
    fields: Callable[[Mapping[str, Any], int, int], dict[str, Any]]
    extra: Callable[[Mapping[str, Any], str], dict[str, torch.Tensor]] = lambda cfg, prefix: {}


MOE_FAMILIES: Registry[MoEFamily] = Registry("dense family with an MoE counterpart")


def _mixtral(cfg: Mapping[str, Any], experts: int, top_k: int) -> dict[str, Any]:
    for bias in ("attention_bias", "mlp_bias"):
        if cfg.get(bias):
            raise ConfigError(f"the models set {bias}: Mixtral's layers have no biases, so they cannot become a "
                              "Mixtral checkpoint")
    return {"num_local_experts": experts, "num_experts_per_tok": top_k}


def _qwen2_moe(cfg: Mapping[str, Any], experts: int, top_k: int) -> dict[str, Any]:
    return {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": cfg["intermediate_size"],
            "shared_expert_intermediate_size": 1, "norm_topk_prob": True, "decoder_sparse_step": 1,
            "mlp_only_layers": []}


def _zero_shared_expert(cfg: Mapping[str, Any], prefix: str) -> dict[str, torch.Tensor]:
    d = int(cfg["hidden_size"])
    mlp = f"{prefix}.mlp"
    return {f"{mlp}.shared_expert.gate_proj.weight": torch.zeros(1, d),
            f"{mlp}.shared_expert.up_proj.weight": torch.zeros(1, d),
            f"{mlp}.shared_expert.down_proj.weight": torch.zeros(d, 1),
            f"{mlp}.shared_expert_gate.weight": torch.zeros(1, d)}


for _dense in ("llama", "mistral"):
    MOE_FAMILIES.register(_dense)(MoEFamily("mixtral", _mixtral))
MOE_FAMILIES.register("qwen2")(MoEFamily("qwen2_moe", _qwen2_moe, _zero_shared_expert))


def moe_family(config: Mapping[str, Any]) -> MoEFamily:
    """The MoE family of a dense config; ConfigError naming the family and those that have one."""
    family = str(config.get("model_type"))
    if family not in MOE_FAMILIES.names():
        raise ConfigError(f"dense → MoE builds Mixtral from Llama or Mistral models and Qwen2-MoE from Qwen2 models; "
                          f"these are {family} models, whose layers no MoE family in transformers shares "
                          f"(families: {', '.join(MOE_FAMILIES.names())})")
    return MOE_FAMILIES.get(family)


def moe_config(config: Mapping[str, Any], experts: int, top_k: int):
    """The transformers config of the MoE: the dense ``config``'s fields (attention, norms, rotary, vocabulary) with
    the MoE family's own."""

    family = moe_family(config)
    dropped = {"architectures", "model_type", "transformers_version", "mlp_bias", "auto_map"}
    kwargs = {k: v for k, v in config.items() if k not in dropped}
    return config_class(family.moe_type, f"the {family.moe_type} config")(**kwargs, **family.fields(config, experts, top_k))


def moe_state_dict(config: Mapping[str, Any], sds: Sequence[Mapping[str, torch.Tensor]],
                   routers: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The MoE's tensors from N aligned dense state dicts (Hugging Face names): shared tensors averaged, model
    ``i``'s FFN as expert ``i`` (banks ``experts.gate_up_proj`` (E, 2I, d), rows ``[gate | up]``, and
    ``experts.down_proj`` (E, d, I)), ``routers``: layer prefix → router rows (E, d)."""
    family = moe_family(config)
    out: dict[str, torch.Tensor] = {}
    layers: dict[str, dict[str, list[torch.Tensor]]] = {}
    for key in sds[0]:
        if (m := FFN.match(key)) is not None:
            layers.setdefault(m["layer"], {})[m["proj"]] = [sd[key].float() for sd in sds]
        else:
            out[key] = torch.stack([sd[key].float() for sd in sds]).mean(0).to(sds[0][key].dtype)
    if config.get("tie_word_embeddings") and "lm_head.weight" not in out:  # stored once, as save_pretrained does
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    for prefix, p in layers.items():
        out[f"{prefix}.mlp.experts.gate_up_proj"] = torch.stack([torch.cat(gu) for gu in zip(p["gate"], p["up"], strict=True)])
        out[f"{prefix}.mlp.experts.down_proj"] = torch.stack(p["down"])
        out[f"{prefix}.mlp.gate.weight"] = routers[prefix].float()
        out.update(family.extra(config, prefix))
    return out


def ffn_input_moments(model, blocks: torch.Tensor, batch: int = 16) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per layer prefix (``model.layers.i``) of a dense causal LM: the mean (d,) and the mean per-coordinate variance
    (scalar) of its FFN's input (the post-attention norm's output) over every token of ``blocks`` (n, T)."""
    sums: dict[str, list[torch.Tensor]] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def hook(_mod, _inp, out, name=f"model.layers.{i}"):
            h = out.detach().reshape(-1, out.shape[-1]).double()
            acc = sums.setdefault(name, [torch.zeros((), dtype=torch.float64), 0, 0])
            acc[0] = acc[0] + h.sum(0)
            acc[1] = acc[1] + (h * h).sum(0)
            acc[2] += h.shape[0]
        hooks.append(layer.post_attention_layernorm.register_forward_hook(hook))
    try:
        with torch.no_grad():
            for s in range(0, len(blocks), batch):
                model(input_ids=blocks[s:s + batch])
    finally:
        for h in hooks:
            h.remove()
    moments = {}
    for name, (s, sq, n) in sums.items():
        mean = s / n
        moments[name] = (mean.float(), (sq / n - mean * mean).mean().float())
    return moments


def router_from_moments(moments: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Router rows (E, d) from each expert's FFN-input mean and variance: ``(m_i − m̄) / σ²``, σ² the mean of the
    variances (the nearest-mean classifier of spherical Gaussians of one variance)."""
    means = torch.stack([m for m, _ in moments])
    var = torch.stack([v for _, v in moments]).mean().clamp_min(1e-8)
    return (means - means.mean(0)) / var


EXPERT = re.compile(r"\.mlp\.(experts|shared_expert)\b|\.mlp\.shared_expert_gate\.")
"""A tensor of an expert (Mixtral's and Qwen2-MoE's expert banks, Qwen2-MoE's shared expert and its gate)."""

TRAINABLE: Registry[Callable[[str], bool]] = Registry("part of a causal LM to train")
"""What a training phase of :func:`train_part` updates, by parameter name."""
TRAINABLE.register("router")(lambda name: name.endswith("mlp.gate.weight"))
TRAINABLE.register("shared")(lambda name: EXPERT.search(name) is None)  # the router and every averaged tensor
TRAINABLE.register("all")(lambda name: True)


def train_part(model, data: Sequence[torch.Tensor], steps: int, *, part: str = "router", lr: float = 1e-2,
               batch: int = 16, seed: int = 0) -> list[float]:
    """Train one part (:data:`TRAINABLE`) of a causal LM for ``steps`` AdamW steps (no weight decay, learning rate
    ``lr`` decayed to 0 by a cosine) on the language-model loss, each batch drawn from the blocks of every dataset in
    ``data``; every other parameter frozen. Of an MoE, ``"router"``: the router rows alone; ``"shared"``: the router
    and every tensor the dense models shared (embeddings, attention, norms, head), the experts frozen — each expert
    stays its dense model's FFN; ``"all"``: every tensor (of any model). Returns the losses (one per step).

    Raises: ConfigError naming ``part`` if it is not a registered part.
    """
    select = TRAINABLE.get(part)
    params = [p for n, p in model.named_parameters() if select(n)]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    blocks = torch.cat(list(data))
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    losses = []
    model.train()
    for _ in range(steps):
        x = blocks[torch.randint(0, len(blocks), (min(batch, len(blocks)),), generator=gen)]
        opt.zero_grad()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    return losses


def _per_model(data: Sequence[torch.Tensor] | torch.Tensor, n: int, vocab_size: int) -> list[torch.Tensor]:
    blocks = [data] if isinstance(data, torch.Tensor) else list(data)
    if len(blocks) not in (1, n):
        raise ConfigError(f"give one dataset for all models or one per model: {n} models, {len(blocks)} datasets")
    for i, b in enumerate(blocks):
        if not isinstance(b, torch.Tensor) or b.dim() != 2 or b.dtype != torch.long or len(b) == 0:
            raise ConfigError("each dataset must be token ids, a non-empty int64 tensor (blocks, tokens)")
        if int(b.min()) < 0 or int(b.max()) >= vocab_size:
            raise ConfigError(f"dataset {i}: token ids must lie in [0, {vocab_size}) (the models' vocab_size); "
                              f"found {int(b.min())} … {int(b.max())}")
    return blocks * n if len(blocks) == 1 else blocks


def _dense_model(config: Mapping[str, Any], sd: Mapping[str, torch.Tensor]):
    """The dense causal LM of ``config`` holding ``sd`` (every tensor; a tied head may be absent)."""
    import transformers

    cfg = config_class(config["model_type"], "config.json")(**{k: v for k, v in config.items() if k != "model_type"})
    model = transformers.AutoModelForCausalLM.from_config(cfg, trust_remote_code=False).float().eval()
    missing, unexpected = model.load_state_dict(dict(sd), strict=False)
    if unexpected or any(k != "lm_head.weight" for k in missing):
        raise ConfigError(f"the aligned tensors do not fit a {config['model_type']} model: missing {missing}, "
                          f"unexpected {unexpected}")
    return model


class _Moved(Mapping[str, torch.Tensor]):
    """The tensors of ``src`` (a mapping read on lookup: a lazy checkpoint, an absorbed view) moved by the group
    element ``element`` of ``spec`` (None: as they are), computed when looked up and never kept, and the tensors
    ``extra`` as they are (the unit norm weights of a stock model)."""

    def __init__(self, src: Mapping[str, torch.Tensor], spec=None, element=None,
                 extra: Mapping[str, torch.Tensor] | None = None) -> None:
        self.src, self.spec, self.element, self.extra = src, spec, element, dict(extra or {})
        self.cache: dict = {}

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.extra:
            return self.extra[key]
        t = self.src[key]
        return t if self.element is None else self.spec.apply_tensor(key, t, self.element, cache=self.cache)

    def __contains__(self, key: object) -> bool:
        return key in self.extra or key in self.src

    def __iter__(self):
        yield from self.src
        yield from self.extra

    def __len__(self) -> int:
        return len(self.src) + len(self.extra)


@dataclass
class Aligned:
    """Every model's tensors in the first one's basis (:class:`_Moved`: read on lookup, one tensor at a time), the
    alignments' records, the group used and the config the tensors fit (the full group unties the head and sets every
    norm weight to one)."""

    sds: list[Mapping[str, torch.Tensor]]
    records: list[dict[str, Any]]
    groups: str | None
    config: dict[str, Any]


def _matched(spec, sds: list[Mapping[str, torch.Tensor]], paths: list[Path], seed: int,
             extra: Mapping[str, torch.Tensor] | None = None) -> tuple[list[_Moved], list[dict[str, Any]]]:
    """Every model of ``sds`` matched to the first (weight matching, ``seed``) and moved there lazily, with the
    alignment records."""
    elements, records = align_to_first(spec, sds, model_names(paths), WeightMatchingConfig(seed=seed), None)
    return [_Moved(sd, spec, g, extra) for sd, g in zip(sds, elements, strict=True)], records


def _align_permutations(paths: list[Path], ckpts, spec, config: dict[str, Any], seed: int) -> Aligned:
    """Streaming weight matching with permutations (``spec`` None: the tensors as stored)."""
    if spec is None:
        return Aligned(list(ckpts), [], None, config)
    return Aligned(*_matched(spec, ckpts, paths, seed), "permutation", config)


def _align_full_group(paths: list[Path], config: dict[str, Any], seed: int) -> Aligned | None:
    """Weight matching with the full transformer group after normalization absorption
    (:data:`~modeconn.symmetry.hf.FULL_GROUPS`: a residual rotation, per-head orthogonal maps, FFN permutations), as
    ``align --groups full`` runs it (:func:`~modeconn.recipes.hf_stream.align_hf_full_group`): every model absorbed
    tensor by tensor in fp32 (:class:`~modeconn.symmetry.absorb_stream.AbsorbedView`), no model loaded; every model
    then read as a stock model of its family (norm weights one, head untied:
    :func:`~modeconn.symmetry.absorb_export.stock_norm_weights`). None, before any weight is read, where the
    family's norms cannot hold the result."""
    from .symmetry.absorb_export import stock_norm_weights
    from .symmetry.absorb_stream import AbsorbedView
    from .symmetry.hf import FULL_GROUPS, hf_symmetry_spec

    views = [AbsorbedView(p, torch.float32) for p in paths]
    norms = stock_norm_weights(views[0])
    if norms is None:
        return None
    sds, records = _matched(hf_symmetry_spec(views[0].model, FULL_GROUPS), views, paths, seed, norms)
    return Aligned(sds, records, "full", {**config, "tie_word_embeddings": False})


def _aligned(paths: list[Path], ckpts, spec, config: dict[str, Any], align: str, seed: int, log: Log) -> Aligned:
    """Every model aligned to the first as ``align`` says: ``"full"`` (the full group where the family's norms can
    hold it, else permutations), ``"weight"`` (permutations), ``"none"``."""
    if align == "full":
        full = _align_full_group(paths, config, seed)
        if full is not None:
            log("aligned every model to the first: weight matching, full group")
            return full
        log(f"{config['model_type']}: the full group's result is no stock checkpoint; aligning with permutations")
    aligned = _align_permutations(paths, ckpts, spec, config, seed)
    if aligned.groups is not None:
        log("aligned every model to the first: weight matching, permutations")
    return aligned


def _routers(aligned: Aligned, blocks: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per layer the router rows from every aligned dense model's FFN inputs on its own blocks."""
    moments = [ffn_input_moments(_dense_model(aligned.config, sd), b) for sd, b in zip(aligned.sds, blocks, strict=True)]
    return {name: router_from_moments([m[name] for m in moments]) for name in moments[0]}


def _write(out: PathLike, moe, source: Path, inputs: list[Path], record: dict[str, Any], dtype, overwrite: bool) -> None:
    """``moe`` saved in ``dtype`` with ``source``'s tokenizer files and ``record`` as ``moe.json``, atomically."""
    with output_directory(out, inputs=inputs, overwrite=overwrite, command="moe") as tmp:
        if isinstance(dtype, str) and dtype != "float32":
            moe = moe.to(getattr(torch, dtype))
        moe.save_pretrained(tmp)
        copy_code_free_side_files(source, tmp)
        write_json(tmp / "moe.json", record)


def _batch_loss(model, x: torch.Tensor) -> float:
    with torch.no_grad():
        return float(model(input_ids=x, labels=x).loss)


def _train(moe, blocks: list[torch.Tensor], part: str, steps: int, lr: float, seed: int,
           log: Log) -> list[float] | None:
    """One training phase of the built MoE; the loss on a fixed batch (the first 16 blocks) before and after it
    (None without steps). NonFiniteError if a loss or a trained weight is not finite."""
    if not steps:
        return None
    probe = torch.cat([b[:16] for b in blocks])[:16]
    before = _batch_loss(moe, probe)
    losses = train_part(moe, blocks, steps, part=part, lr=lr, seed=seed)
    after = _batch_loss(moe, probe)
    weights_finite = all(bool(torch.isfinite(p).all()) for p in moe.parameters())
    if not (weights_finite and all(math.isfinite(v) for v in (*losses, after))):
        raise NonFiniteError(f"the MoE's {part} training diverged (loss {after} after {steps} steps at lr {lr:g}"
                             f"{'' if weights_finite else ', non-finite weights'}); nothing was written: lower the "
                             "learning rate")
    log(f"{part} trained {steps} steps: loss {before:.4f} → {after:.4f}"
        + (" (it rose: the learning rate may be too high)" if after > before else ""))
    return [before, after]


FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _check_training(steps: Mapping[str, Any], rates: Mapping[str, Any], blocks: list[torch.Tensor]) -> None:
    """ConfigError naming the first step count that is no integer ≥ 0, learning rate that is no positive float32 value,
    or, when anything trains, blocks the batches cannot be drawn from (under two tokens, lengths that differ)."""
    for name, value in steps.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name} must be an integer, 0 or more, got {value!r}")
    for name, value in rates.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= FLOAT32_MAX:
            raise ConfigError(f"{name} must be a positive finite number (float32), got {value!r}")
    if any(steps.values()):
        lengths = sorted({int(b.shape[1]) for b in blocks})
        if lengths[0] < 2:
            raise ConfigError(f"the trainings need blocks of at least 2 tokens (one to predict); got {lengths[0]}")
        if len(lengths) > 1:
            raise ConfigError(f"the trainings draw batches from every dataset: give blocks of one length, got "
                              f"{', '.join(map(str, lengths))} tokens")


ALIGNMENTS = ("full", "weight", "none")
"""``align`` choices of :func:`dense_to_moe`."""


def dense_to_moe(models: Sequence[PathLike], out: PathLike, *, data: Sequence[torch.Tensor] | torch.Tensor,
                 top_k: int | None = None, router_steps: int = 0, router_lr: float = 1e-2, shared_steps: int = 0,
                 shared_lr: float = 3e-3, align: str = "full", seed: int = 0, overwrite: bool = False,
                 log: Log | None = None) -> dict[str, Any]:
    """Build one MoE checkpoint at ``out`` from dense Hugging Face causal LMs ``models`` (module docstring).

    Args:
        models: two or more checkpoint directories of one dense family (Llama, Mistral, Qwen2), same config and
            vocabulary; the first is the reference of the alignment.
        data: token-id blocks (n, T), one tensor for all models or one per model (its own data): the routers'
            statistics and the trainings' batches.
        top_k: active experts per token (default ``min(2, N)``); ``router_steps``/``router_lr``: router-only training
            after the initialisation (0: none); ``shared_steps``/``shared_lr``: then training of the router and the
            averaged tensors, the experts frozen (0: none; :func:`train_part`); both with a cosine decay; ``align``:
            ``"full"`` (weight matching with the full group where the family's norms can hold it, else
            permutations), ``"weight"`` (permutations, streamed) or ``"none"``;
            ``seed``: the alignment's and the trainings'.
    Returns: the record written as ``moe.json``.
    Raises: ConfigError (another family — named —, fewer than two models, bad ``top_k``/``align``/data/steps/learning
        rates, blocks a training cannot batch) and the checkpoint errors of
        :func:`modeconn.stream.open_hf_checkpoints` (CheckpointError for an ``out`` that is an input or not writable),
        all before any weights are read; NonFiniteError if a training phase diverges (a loss or a trained weight not
        finite; nothing written).
    """
    import transformers

    from .stream import open_hf_checkpoints

    log = log or (lambda s: None)
    paths = [Path(p) for p in models]
    if len(paths) < 2:
        raise ConfigError(f"dense → MoE needs at least two models, got {len(paths)}")
    if align not in ALIGNMENTS:
        raise ConfigError(f"align must be one of {', '.join(ALIGNMENTS)}; got {align!r}")
    top_k = min(2, len(paths)) if top_k is None else top_k
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= len(paths):
        raise ConfigError(f"top_k must be an integer between 1 and the number of experts ({len(paths)}), "
                          f"got {top_k!r}")
    config = read_json_object(paths[0] / "config.json", "config file")
    moe_config(config, len(paths), top_k)  # the family and its fields: refused before anything else is read
    blocks = _per_model(data, len(paths), int(config.get("vocab_size", 0)))
    _check_training({"router_steps": router_steps, "shared_steps": shared_steps},
                    {"router_lr": router_lr, "shared_lr": shared_lr}, blocks)
    spec, ckpts = open_hf_checkpoints(paths, out, overwrite, None if align == "none" else "permutation")
    aligned = _aligned(paths, ckpts, spec, config, align, seed, log)
    moe = transformers.AutoModelForCausalLM.from_config(moe_config(aligned.config, len(paths), top_k), trust_remote_code=False).float()
    moe.load_state_dict(moe_state_dict(aligned.config, aligned.sds, _routers(aligned, blocks)), strict=True)
    losses = {part: _train(moe, blocks, part, steps, lr, seed, log)
              for part, steps, lr in (("router", router_steps, router_lr), ("shared", shared_steps, shared_lr))}
    record = {"experts_from": model_names(paths), "moe_type": moe_family(config).moe_type, "top_k": top_k,
              "align": align, "groups": aligned.groups, "alignments": aligned.records, "seed": seed,
              "router": {"init": "centred mean FFN input over pooled variance", "steps": router_steps,
                         "lr": router_lr, "tokens": [int(b.numel()) for b in blocks], "loss": losses["router"]},
              "shared": {"steps": shared_steps, "lr": shared_lr, "trains": "router and averaged tensors, experts frozen",
                         "loss": losses["shared"]}}
    _write(out, moe, paths[0], paths, record, config.get("dtype") or config.get("torch_dtype"), overwrite)
    return record

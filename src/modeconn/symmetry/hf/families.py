"""The pre-norm families: one :class:`~modeconn.symmetry.hf.prenorm.Table` entry each (adding a family is one
entry here; :mod:`.prenorm` says what the fields mean).

Decoders: Llama, Mistral, Qwen2 (Q/K/V biases), Qwen3 (a ``head_dim`` RMSNorm on Q and K shared by every head:
qk frozen), Gemma (``1 + w`` RMSNorm, scaled and tied embeddings, GeGLU), Gemma2 (sandwich norms, soft-capped
attention and logits: elementwise, so no symmetry changes), Gemma3 (Gemma2's sandwich norms with Qwen3's Q/K
norms), Cohere (parallel block, mean-subtracting ``CohereLayerNorm`` without bias, interleaved rotary, logit
scale), Phi-3 (fused ``qkv_proj`` and ``[gate | up]``), Phi (parallel block, partial rotary, LayerNorm with bias,
head bias), OLMo (parameter-free LayerNorm; ``clip_qkv`` restricts Q/K/V maps to permutations), OLMo2 (post-norms
only, Q/K norms over the whole projection), StableLM (partial rotary, LayerNorm with bias, optional parallel
residual; per-head Q/K LayerNorms freeze heads and Q/K), Starcoder2, GPT-J (parallel block, interleaved partial
rotary), OPT (learned positions), Falcon (fused multi-query / grouped / per-head QKV, parallel block, optional
ALiBi), BLOOM (embedding LayerNorm, ALiBi: head permutations frozen), GPT-NeoX.
Pre-LN vision encoders: DeiT (distillation token), CLIP's vision tower (embedding LayerNorm; the pooled CLS
token's ``post_layernorm`` feeds ``visual_projection``; ``CLIPForImageClassification`` reads the stream), DINOv2
(layer scales; the classifier reads the CLS token and the patch mean), BEiT (layer scales; per-head relative position
biases freeze head permutations; mean pooling through the pooler's norm), SigLIP's vision tower (the pooling head's
probe moves with the stream) and SigLIP image classifiers.
Decoders added for #34: Arcee, Nemotron (LayerNorm1P: ``1 + w``), VaultGemma, Hunyuan dense, GLM and GLM-4 (fused
``gate_up``, interleaved partial rotary; GLM-4's post-norms), Apertus (xIELU parameters frozen), Persimmon, GPT-Neo,
CodeGen (its QKV layout), GPT-BigCode, MPT (ALiBi). Encoder: ModernBERT's base model (embedding LayerNorm, fused
``[Q | K | V]`` and ``[act | gate]`` GLU, no attention norm in the first layer, local/global attention).

Mixture-of-Experts decoders (:mod:`.moe`): Mixtral, Qwen2-MoE (a shared expert behind a sigmoid gate; dense layers
where ``mlp_only_layers`` / ``decoder_sparse_step`` say so), Qwen3-MoE (Qwen3's per-head Q/K norms), OLMoE (Q/K norms
over the whole projection, optional ``clip_qkv``), GraniteMoE (scalar embedding / residual / attention / logit
multipliers: no symmetry changes).

``absorb``: where :func:`modeconn.absorb_normalization` cannot apply, the reason.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ._common import pixel_inputs
from .moe import MoE
from .prenorm import Embedding, Table, register

_NOT_PRE_NORM = ("{}: normalization absorption needs every norm to read the stream and feed linear layers; {} "
                 "normalise what a block writes (or the embeddings) before it joins the stream, so their scales "
                 "cannot be folded into readers and no orthogonal residual symmetry appears")


def _lm(prefix: str, *extra: str) -> tuple[str, ...]:
    return (f"{prefix}Model", f"{prefix}ForCausalLM", f"{prefix}ForSequenceClassification",
            f"{prefix}ForTokenClassification", f"{prefix}ForQuestionAnswering", *extra)



def _act(field: str):
    return lambda cfg: str(getattr(cfg, field, ""))


def _falcon_layout(cfg: Any) -> str:
    if cfg.new_decoder_architecture:
        return "grouped"
    return "blocks" if cfg.multi_query else "per_head"


register(Table("llama", _lm("Llama")))
register(Table("mistral", _lm("Mistral")))
register(Table("qwen2", _lm("Qwen2")))
register(Table("qwen3", _lm("Qwen3")))
register(Table("gemma", _lm("Gemma"), norm_offset=1.0))
register(Table("gemma2", _lm("Gemma2"), norm_offset=1.0, mlp_norm=("pre_feedforward_layernorm",),
               post_norms=("post_attention_layernorm", "post_feedforward_layernorm"),
               absorb=_NOT_PRE_NORM.format("Gemma2", "its sandwich norms (post_attention_layernorm, "
                                                     "post_feedforward_layernorm)")))
register(Table("gemma3_text", ("Gemma3TextModel", "Gemma3ForCausalLM"), norm_offset=1.0,
               mlp_norm=("pre_feedforward_layernorm",), post_norms=("post_attention_layernorm", "post_feedforward_layernorm"),
               absorb=_NOT_PRE_NORM.format("Gemma3", "its sandwich norms")))
register(Table("cohere", _lm("Cohere"), mlp_norm=(), parallel=True, rotary="interleaved", norm_kind="layernorm"))
register(Table("phi3", _lm("Phi3"), qkv="qkv_proj", gate_up="gate_up_proj"))
register(Table("phi", _lm("Phi"), o="dense", up="fc1", gate=None, down="fc2", mlp_norm=(), parallel=True,
               final_norm="final_layernorm"))
register(Table("olmo", _lm("Olmo"), clip_qkv=lambda cfg: cfg.clip_qkv is not None))
register(Table("olmo2", _lm("Olmo2"), attn_norm=(), mlp_norm=(),
               post_norms=("post_attention_layernorm", "post_feedforward_layernorm"),
               absorb=_NOT_PRE_NORM.format("OLMo2", "its post-norms")))
register(Table("stablelm", _lm("StableLm"), parallel=lambda cfg: cfg.use_parallel_residual))
register(Table("starcoder2", _lm("Starcoder2"), up="c_fc", gate=None, down="c_proj"))
register(Table("gptj", _lm("GPTJ"), embeddings=(Embedding("wte"),), layers="h", attn="attn", o="out_proj", up="fc_in",
               gate=None, down="fc_out", attn_norm=("ln_1",), mlp_norm=(), parallel=True, final_norm="ln_f",
               rotary="interleaved", activation=_act("activation_function")))
register(Table("opt", _lm("OPT"), embeddings=(Embedding("decoder.embed_tokens"), Embedding("decoder.embed_positions")),
               layers="decoder.layers", o="out_proj", mlp="", up="fc1", gate=None, down="fc2",
               attn_norm=("self_attn_layer_norm",), mlp_norm=("final_layer_norm",), final_norm="decoder.final_layer_norm",
               rotary=None, activation=_act("activation_function"),
               requires=(("do_layer_norm_before", lambda v: v is not False, "True (pre-norm)"),)))
register(Table("falcon", _lm("Falcon"), embeddings=(Embedding("word_embeddings"),), layers="h", attn="self_attention",
               qkv="query_key_value", qkv_layout=_falcon_layout, o="dense", up="dense_h_to_4h", gate=None,
               down="dense_4h_to_h", attn_norm=("ln_attn", "input_layernorm"), mlp_norm=("ln_mlp", "post_attention_layernorm"),
               parallel=lambda cfg: cfg.parallel_attn or cfg.new_decoder_architecture, final_norm="ln_f",
               rotary=lambda cfg: None if cfg.alibi else "half", alibi=lambda cfg: cfg.alibi, activation=_act("activation")))
register(Table("bloom", _lm("Bloom"), embeddings=(Embedding("word_embeddings"),), embed_norm="word_embeddings_layernorm",
               layers="h", attn="self_attention", qkv="query_key_value", qkv_layout="per_head", o="dense",
               up="dense_h_to_4h", gate=None, down="dense_4h_to_h", final_norm="ln_f", rotary=None, alibi=True,
               activation=lambda cfg: "gelu",
               requires=(("apply_residual_connection_post_layernorm", lambda v: not v, "False"),),
               absorb=_NOT_PRE_NORM.format("BLOOM", "word_embeddings_layernorm and the stream it starts")))
register(Table("arcee", _lm("Arcee"), gate=None))
register(Table("nemotron", _lm("Nemotron"), gate=None, norm_offset=1.0))
register(Table("vaultgemma", _lm("VaultGemma"), norm_offset=1.0, mlp_norm=("pre_feedforward_layernorm",)))
register(Table("hunyuan_v1_dense", _lm("HunYuanDenseV1")))
register(Table("glm", _lm("Glm"), gate_up="gate_up_proj", rotary="interleaved"))
register(Table("glm4", _lm("Glm4"), gate_up="gate_up_proj", rotary="interleaved",
               post_norms=("post_self_attn_layernorm", "post_mlp_layernorm"),
               absorb=_NOT_PRE_NORM.format("GLM-4", "its post-norms (post_self_attn_layernorm, post_mlp_layernorm)")))
register(Table("apertus", _lm("Apertus"), gate=None, attn_norm=("attention_layernorm",),
               mlp_norm=("feedforward_layernorm",), frozen=("mlp.act_fn",)))
register(Table("persimmon", _lm("Persimmon"), qkv="query_key_value", qkv_layout="per_head", o="dense",
               up="dense_h_to_4h", gate=None, down="dense_4h_to_h", final_norm="final_layernorm"))
register(Table("gpt_neo", _lm("GPTNeo"), embeddings=(Embedding("wte"), Embedding("wpe")), layers="h",
               attn="attn.attention", o="out_proj", up="c_fc", gate=None, down="c_proj", attn_norm=("ln_1",),
               mlp_norm=("ln_2",), final_norm="ln_f", rotary=None, activation=_act("activation_function")))
register(Table("codegen", _lm("CodeGen"), embeddings=(Embedding("wte"),), layers="h", attn="attn", qkv="qkv_proj",
               qkv_layout="codegen", o="out_proj", up="fc_in", gate=None, down="fc_out", attn_norm=("ln_1",),
               mlp_norm=(), parallel=True, final_norm="ln_f", rotary="interleaved",
               activation=_act("activation_function")))
register(Table("gpt_bigcode", _lm("GPTBigCode"), embeddings=(Embedding("wte"), Embedding("wpe")), layers="h",
               attn="attn", qkv="c_attn", qkv_layout=lambda cfg: "blocks" if cfg.multi_query else "per_head",
               o="c_proj", up="c_fc", gate=None, down="c_proj", attn_norm=("ln_1",), mlp_norm=("ln_2",),
               final_norm="ln_f", rotary=None, activation=_act("activation_function"),
               requires=(("add_cross_attention", lambda v: not v, "False"),)))
register(Table("mpt", _lm("Mpt"), embeddings=(Embedding("wte"),), layers="blocks", attn="attn", qkv="Wqkv",
               o="out_proj", mlp="ffn", gate=None, attn_norm=("norm_1",), mlp_norm=("norm_2",), final_norm="norm_f",
               rotary=None, alibi=lambda cfg: bool(cfg.attn_config.alibi),
               clip_qkv=lambda cfg: cfg.attn_config.clip_qkv is not None, activation=lambda cfg: "gelu"))
register(Table("modernbert", ("ModernBertModel",), embeddings=(Embedding("embeddings.tok_embeddings"),),
               embed_norm="embeddings.norm", attn="attn", qkv="Wqkv", o="Wo", gate_up="Wi", down="Wo",
               attn_norm=("attn_norm",), mlp_norm=("mlp_norm",), final_norm="final_norm",
               absorb=_NOT_PRE_NORM.format("ModernBERT", "embeddings.norm and the stream it starts")))
register(Table("gpt_neox", _lm("GPTNeoX"), embeddings=(Embedding("embed_in"),), attn="attention", qkv="query_key_value",
               qkv_layout="per_head", o="dense", up="dense_h_to_4h", gate=None, down="dense_4h_to_h",
               final_norm="final_layer_norm", heads=("embed_out", "lm_head", "score", "classifier", "qa_outputs")))

# Mixture-of-Experts decoders (:mod:`.moe`): stacked expert banks, a router per layer, Qwen2-MoE's shared expert
register(Table("mixtral", _lm("Mixtral"), moe=MoE()))
register(Table("qwen2_moe", _lm("Qwen2Moe"), moe=MoE(shared="shared_expert", shared_gate="shared_expert_gate")))
register(Table("qwen3_moe", _lm("Qwen3Moe"), moe=MoE()))
register(Table("olmoe", _lm("Olmoe"), moe=MoE(), clip_qkv=lambda cfg: cfg.clip_qkv is not None))
register(Table("granitemoe", _lm("GraniteMoe"), mlp="block_sparse_moe", moe=MoE(router="router")))

_DEIT_TOKENS = tuple(Embedding("embeddings", n, 2, optional=o) for n, o in (
    ("cls_token", False), ("distillation_token", False), ("position_embeddings", False), ("mask_token", True)))
register(Table("deit", ("DeiTForImageClassification", "DeiTForImageClassificationWithTeacher"),
               embeddings=(Embedding("embeddings.patch_embeddings.projection", linear=True), *_DEIT_TOKENS),
               attn="attention", up="fc1", gate=None, down="fc2", attn_norm=("layernorm_before",),
               mlp_norm=("layernorm_after",), final_norm="layernorm",
               heads=("classifier", "cls_classifier", "distillation_classifier"), rotary=None, example=pixel_inputs))

def _clip_tower(model: nn.Module) -> str:
    """The vision transformer's path: ``vision_model`` (every class in transformers 4; the projection and
    classification classes in 5, where ``CLIPVisionModel`` *is* the transformer), else the model itself."""
    return "vision_model" if isinstance(getattr(model, "vision_model", None), nn.Module) else ""


_CLIP = dict(embeddings=(Embedding("embeddings", "class_embedding", 0), Embedding("embeddings.patch_embedding", linear=True),
                         Embedding("embeddings.position_embedding")),
             embed_norm="pre_layrnorm", layers="encoder.layers", o="out_proj", up="fc1", gate=None, down="fc2",
             attn_norm=("layer_norm1",), mlp_norm=("layer_norm2",), final_norm="post_layernorm", rotary=None,
             example=pixel_inputs, base=_clip_tower)
_LAYER_SCALE = ("{}: normalization absorption does not fold layer scales ({}: a per-channel scale of what each block "
                "writes, which centering the writers would have to fold into them first)")
_VIT_PATCHES = (Embedding("embeddings.patch_embeddings.projection", linear=True), Embedding("embeddings", "cls_token", 2))
register(Table("dinov2", ("Dinov2Model", "Dinov2ForImageClassification"),
               embeddings=(*_VIT_PATCHES, Embedding("embeddings", "position_embeddings", 2),
                           Embedding("embeddings", "mask_token", 1, optional=True)),
               layers="encoder.layer", attn="attention", up="fc1", gate=None, down="fc2", attn_norm=("norm1",),
               mlp_norm=("norm2",), final_norm="layernorm", heads=("classifier",), head_copies=2,
               layer_scales=("layer_scale1.lambda1", "layer_scale2.lambda1"), rotary=None, example=pixel_inputs,
               requires=(("use_swiglu_ffn", lambda v: not v, "False (the SwiGLU FFN variant has no table yet)"),),
               absorb=_LAYER_SCALE.format("DINOv2", "layer_scale1/2.lambda1")))
register(Table("beit", ("BeitModel", "BeitForImageClassification"),
               embeddings=(*_VIT_PATCHES, Embedding("embeddings", "mask_token", 2, optional=True),
                           Embedding("embeddings", "position_embeddings", 2, optional=True)),
               attn="attention", up="fc1", gate=None, down="fc2", attn_norm=("layernorm_before",),
               mlp_norm=("layernorm_after",), heads=("classifier",), layer_scales=("lambda_1", "lambda_2"),
               final_norm=lambda cfg: "pooler.layernorm" if cfg.use_mean_pooling else "layernorm",
               frozen=("relative_position_bias",), shared_frozen=("shared_position_bias",),
               alibi=lambda cfg: cfg.use_relative_position_bias or cfg.use_shared_relative_position_bias,
               rotary=None, example=pixel_inputs, absorb=_LAYER_SCALE.format("BEiT", "lambda_1/2")))

_CLIP_ABSORB = _NOT_PRE_NORM.format("CLIP vision", "pre_layrnorm")
register(Table("clip_vision_model", ("CLIPVisionModel", "CLIPVisionModelWithProjection"), heads=("visual_projection",),
               returns_stream=("CLIPVisionModelWithProjection",), absorb=_CLIP_ABSORB, **_CLIP))
register(Table("clip", ("CLIPForImageClassification",), heads=("classifier",), final_norm_feeds_heads=False,
               config_of=lambda m: m.config.vision_config, absorb=_CLIP_ABSORB, **_CLIP))

_SIGLIP = dict(embeddings=(Embedding("embeddings.patch_embedding", linear=True), Embedding("embeddings.position_embedding")),
               layers="encoder.layers", o="out_proj", up="fc1", gate=None, down="fc2", attn_norm=("layer_norm1",),
               mlp_norm=("layer_norm2",), final_norm="post_layernorm", rotary=None, example=pixel_inputs, base=_clip_tower)
# the attention-pooling head: its fused in_proj reads the probe through the Q rows and the stream through the K/V
# rows, so the probe is bound as a writer of the stream (q = probe·W_qᵀ is unchanged when both move) and in_proj's
# columns as one reader; the rest of the head computes pooler_output, a model output: frozen
_SIGLIP_VISION = {**_SIGLIP, "embeddings": (*_SIGLIP["embeddings"], Embedding("head", "probe", 2, optional=True))}
register(Table("siglip_vision_model", ("SiglipVisionModel",), shared_frozen=("head",),
               stream_readers=(Embedding("head.attention", "in_proj_weight", 1, optional=True),), **_SIGLIP_VISION))
register(Table("siglip", ("SiglipForImageClassification",), heads=("classifier",), config_of=lambda m: m.config.vision_config,
               shared_frozen=("head",), **_SIGLIP))  # the vision model's pooling head: computed, never read

"""Tiny random Hugging Face models of every adapted family (shared by test_hf_adapters.py and test_absorb.py)."""

from __future__ import annotations

import torch
import transformers as T
from torch import nn

T.logging.set_verbosity_error()

_SIZE = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64, "num_hidden_layers": 2}
_LM = {**_SIZE, "vocab_size": 50, "max_position_embeddings": 32, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
_BERT = {**_SIZE, "vocab_size": 50, "max_position_embeddings": 32, "pad_token_id": 0}
_VIT = {**_SIZE, "image_size": 8, "patch_size": 4, "num_channels": 3}
_T5 = {"vocab_size": 50, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4, "pad_token_id": 0,
       "decoder_start_token_id": 0}
BART = {"vocab_size": 50, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
         "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 48, "pad_token_id": 0, "bos_token_id": 0,
         "eos_token_id": 2, "decoder_start_token_id": 0}

_DEBERTA_V3 = {"relative_attention": True, "pos_att_type": ["p2c", "c2p"], "position_buckets": 8,
               "norm_rel_ebd": "layer_norm", "share_att_key": True, "position_biased_input": False}

_MLA = {"q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6,
        "num_key_value_heads": 4}

_MOBILEBERT = {"embedding_size": 16, "intra_bottleneck_size": 16, "true_hidden_size": 16, "intermediate_size": 24,
               "num_feedforward_networks": 2}

TINY = {
    "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(rotary_pct=0.5, **_LM)),
    "gpt_neox_seq": lambda: T.GPTNeoXForCausalLM(
        T.GPTNeoXConfig(rotary_pct=0.25, use_parallel_residual=False, attention_bias=False, **_LM)),
    "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_head=4, n_layer=2, vocab_size=50, n_positions=32,
                                                   bos_token_id=0, eos_token_id=0)),
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(num_key_value_heads=2, **_LM)),
    "llama_tied_mqa": lambda: T.LlamaForCausalLM(T.LlamaConfig(num_key_value_heads=1, tie_word_embeddings=True, **_LM)),
    "bert": lambda: T.BertModel(T.BertConfig(**_BERT)),
    "bert_cls": lambda: T.BertForSequenceClassification(T.BertConfig(num_labels=3, **_BERT)),
    "bert_mlm": lambda: T.BertForMaskedLM(T.BertConfig(**_BERT)),
    "vit": lambda: T.ViTForImageClassification(T.ViTConfig(num_labels=5, **_VIT)),
    "vit_base": lambda: T.ViTModel(T.ViTConfig(**_VIT)),
    "roberta": lambda: T.RobertaForSequenceClassification(T.RobertaConfig(num_labels=3, **_BERT)),
    "roberta_mlm": lambda: T.RobertaForMaskedLM(T.RobertaConfig(**_BERT)),
    "electra": lambda: T.ElectraForSequenceClassification(T.ElectraConfig(num_labels=3, embedding_size=32, **_BERT)),
    "distilbert": lambda: T.DistilBertForSequenceClassification(T.DistilBertConfig(
        dim=32, n_heads=4, hidden_dim=64, n_layers=2, vocab_size=50, max_position_embeddings=32, num_labels=3)),
    # the families of the table-driven pre-norm description (modeconn/symmetry/hf/families.py)
    "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(num_key_value_heads=2, **_LM)),
    "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(num_key_value_heads=2, **_LM)),
    "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(num_key_value_heads=2, head_dim=8, **_LM)),
    "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(num_key_value_heads=2, head_dim=8, **_LM)),
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(num_key_value_heads=2, head_dim=8, sliding_window=4, **_LM)),
    "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(num_key_value_heads=2, partial_rotary_factor=0.5, **_LM)),
    "phi": lambda: T.PhiForCausalLM(T.PhiConfig(partial_rotary_factor=0.5, **_LM)),
    "olmo": lambda: T.OlmoForCausalLM(T.OlmoConfig(num_key_value_heads=2, **_LM)),
    "olmo2": lambda: T.Olmo2ForCausalLM(T.Olmo2Config(num_key_value_heads=2, **_LM)),
    "stablelm": lambda: T.StableLmForCausalLM(T.StableLmConfig(num_key_value_heads=2, use_qkv_bias=True, **_LM)),
    "starcoder2": lambda: T.Starcoder2ForCausalLM(T.Starcoder2Config(num_key_value_heads=2, **_LM)),
    "gptj": lambda: T.GPTJForCausalLM(T.GPTJConfig(n_embd=32, n_head=4, n_layer=2, n_inner=64, rotary_dim=4, vocab_size=50,
                                                   n_positions=32, bos_token_id=0, eos_token_id=0)),
    "opt": lambda: T.OPTForCausalLM(T.OPTConfig(ffn_dim=64, word_embed_proj_dim=32, **_LM)),
    "falcon": lambda: T.FalconForCausalLM(T.FalconConfig(**_LM)),
    "bloom": lambda: T.BloomForCausalLM(T.BloomConfig(hidden_size=32, n_head=4, n_layer=2, vocab_size=50,
                                                      bos_token_id=0, eos_token_id=0, pad_token_id=0)),
    "gemma3": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(num_key_value_heads=2, head_dim=8, sliding_window=4, **_LM)),
    "cohere": lambda: T.CohereForCausalLM(T.CohereConfig(num_key_value_heads=2, **_LM)),
    # variants: config options that change the layout
    "cohere_qk_norm": lambda: T.CohereForCausalLM(T.CohereConfig(num_key_value_heads=2, use_qk_norm=True, **_LM)),
    "stablelm_parallel_qk_ln": lambda: T.StableLmForCausalLM(T.StableLmConfig(
        num_key_value_heads=2, qk_layernorm=True, use_parallel_residual=True, **_LM)),
    "phi_qk_ln": lambda: T.PhiForCausalLM(T.PhiConfig(partial_rotary_factor=0.5, qk_layernorm=True, **_LM)),
    "falcon_grouped": lambda: T.FalconForCausalLM(T.FalconConfig(new_decoder_architecture=True, num_kv_heads=2, **_LM)),
    "falcon_alibi_mha": lambda: T.FalconForCausalLM(T.FalconConfig(alibi=True, multi_query=False, parallel_attn=False,
                                                                  **_LM)),
    "llama_biases_tied": lambda: T.LlamaForCausalLM(T.LlamaConfig(num_key_value_heads=2, attention_bias=True, mlp_bias=True,
                                                                  tie_word_embeddings=True, head_dim=16, **_LM)),
    "deit_plain": lambda: T.DeiTForImageClassification(T.DeiTConfig(num_labels=5, **_VIT)),
    "deit": lambda: T.DeiTForImageClassificationWithTeacher(T.DeiTConfig(num_labels=5, **_VIT)),
    "clip": lambda: T.CLIPForImageClassification(T.CLIPConfig(
        vision_config={**_VIT, "projection_dim": 16}, text_config={**_SIZE, "vocab_size": 50}, num_labels=5)),
    # CLIP's vision tower alone (transformers 5: CLIPVisionModel is the transformer, no ``vision_model`` inside)
    "clip_vision": lambda: T.CLIPVisionModel(T.CLIPVisionConfig(**_VIT)),
    "clip_vision_proj": lambda: T.CLIPVisionModelWithProjection(T.CLIPVisionConfig(projection_dim=16, **_VIT)),
    # reach, round 2 (#34)
    "xlm_roberta": lambda: T.XLMRobertaForSequenceClassification(T.XLMRobertaConfig(num_labels=3, **_BERT)),
    "xlm_roberta_mlm": lambda: T.XLMRobertaForMaskedLM(T.XLMRobertaConfig(**_BERT)),
    "arcee": lambda: T.ArceeForCausalLM(T.ArceeConfig(num_key_value_heads=2, **_LM)),
    "nemotron": lambda: T.NemotronForCausalLM(T.NemotronConfig(num_key_value_heads=2, partial_rotary_factor=0.5, **_LM)),
    "vaultgemma": lambda: T.VaultGemmaForCausalLM(T.VaultGemmaConfig(num_key_value_heads=2, head_dim=8, sliding_window=4,
                                                                     **_LM)),
    "hunyuan_dense": lambda: T.HunYuanDenseV1ForCausalLM(T.HunYuanDenseV1Config(num_key_value_heads=2, head_dim=8, **_LM)),
    "glm": lambda: T.GlmForCausalLM(T.GlmConfig(num_key_value_heads=2, head_dim=8, **_LM)),
    "glm4": lambda: T.Glm4ForCausalLM(T.Glm4Config(num_key_value_heads=2, head_dim=8, **_LM)),
    "apertus": lambda: T.ApertusForCausalLM(T.ApertusConfig(num_key_value_heads=2, **_LM)),
    "persimmon": lambda: T.PersimmonForCausalLM(T.PersimmonConfig(**_LM)),
    "gpt_neo": lambda: T.GPTNeoForCausalLM(T.GPTNeoConfig(
        hidden_size=32, num_heads=4, num_layers=2, attention_types=[[["global", "local"], 1]], window_size=4,
        intermediate_size=64, vocab_size=50, max_position_embeddings=32, bos_token_id=0, eos_token_id=0)),
    "codegen": lambda: T.CodeGenForCausalLM(T.CodeGenConfig(n_embd=32, n_head=4, n_layer=2, n_inner=64, rotary_dim=4,
                                                            vocab_size=50, n_positions=32, n_ctx=32, bos_token_id=0,
                                                            eos_token_id=0)),
    "gpt_bigcode": lambda: T.GPTBigCodeForCausalLM(T.GPTBigCodeConfig(n_embd=32, n_head=4, n_layer=2, n_inner=64,
                                                                      vocab_size=50, n_positions=32, bos_token_id=0,
                                                                      eos_token_id=0)),
    "gpt_bigcode_mha": lambda: T.GPTBigCodeForCausalLM(T.GPTBigCodeConfig(
        n_embd=32, n_head=4, n_layer=2, n_inner=64, vocab_size=50, n_positions=32, multi_query=False, bos_token_id=0,
        eos_token_id=0)),
    "mpt": lambda: T.MptForCausalLM(T.MptConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, max_seq_len=32,
                                                expansion_ratio=2)),
    "mpt_alibi": lambda: T.MptForCausalLM(T.MptConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, max_seq_len=32,
                                                      expansion_ratio=2, attn_config={"alibi": True})),
    "modernbert": lambda: T.ModernBertModel(T.ModernBertConfig(
        vocab_size=50, max_position_embeddings=32, local_attention=4, global_attn_every_n_layers=2, pad_token_id=0,
        bos_token_id=0, eos_token_id=0, cls_token_id=0, sep_token_id=0, **_SIZE)),
    "llava": lambda: T.LlavaForConditionalGeneration(T.LlavaConfig(
        vision_config=_VIT, text_config={**_LM, "model_type": "llama", "num_key_value_heads": 2}, image_token_index=1)),
    "gemma3_cg": lambda: T.Gemma3ForConditionalGeneration(T.Gemma3Config(
        text_config={**_LM, "num_key_value_heads": 2, "head_dim": 8, "sliding_window": 4}, vision_config=_VIT,
        mm_tokens_per_image=4, image_token_index=1)),
    "mistral3": lambda: T.Mistral3ForConditionalGeneration(T.Mistral3Config(
        vision_config={**_VIT, "model_type": "pixtral", "head_dim": 8, "image_size": 16},
        text_config={**_LM, "model_type": "mistral", "num_key_value_heads": 2, "head_dim": 8}, image_token_index=1)),
    "dinov2": lambda: T.Dinov2Model(T.Dinov2Config(**_VIT)),
    "dinov2_cls": lambda: T.Dinov2ForImageClassification(T.Dinov2Config(num_labels=5, **_VIT)),
    "beit": lambda: T.BeitForImageClassification(T.BeitConfig(num_labels=5, **_VIT)),
    "beit_relative_bias": lambda: T.BeitForImageClassification(T.BeitConfig(
        num_labels=5, use_relative_position_bias=True, use_absolute_position_embeddings=True, **_VIT)),
    "beit_shared_bias_cls_token": lambda: T.BeitForImageClassification(T.BeitConfig(
        num_labels=5, use_shared_relative_position_bias=True, use_mean_pooling=False, **_VIT)),
    "siglip_vision": lambda: T.SiglipVisionModel(T.SiglipVisionConfig(vision_use_head=False, **_VIT)),
    "siglip_vision_head": lambda: T.SiglipVisionModel(T.SiglipVisionConfig(**_VIT)),
    "siglip_cls": lambda: T.SiglipForImageClassification(T.SiglipConfig(
        vision_config=_VIT, text_config={**_SIZE, "vocab_size": 50}, num_labels=5)),
    # encoder–decoders: one stream where the token embeddings are tied, two otherwise (BART untied, Whisper)
    "t5": lambda: T.T5ForConditionalGeneration(T.T5Config(**_T5)),
    "t5_gated_untied_head": lambda: T.T5ForConditionalGeneration(T.T5Config(
        **_T5 | {"num_decoder_layers": 3, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False})),
    "t5_base": lambda: T.T5Model(T.T5Config(**_T5)),
    "t5_encoder": lambda: T.T5EncoderModel(T.T5Config(**_T5)),
    "mt5": lambda: T.MT5ForConditionalGeneration(T.MT5Config(**_T5)),
    "umt5": lambda: T.UMT5ForConditionalGeneration(T.UMT5Config(**_T5)),
    "bart": lambda: T.BartForConditionalGeneration(T.BartConfig(max_position_embeddings=32, **BART)),
    "bart_untied": lambda: T.BartForConditionalGeneration(T.BartConfig(max_position_embeddings=32,
                                                                       tie_word_embeddings=False, **BART)),
    "bart_base": lambda: T.BartModel(T.BartConfig(max_position_embeddings=32, **BART)),
    "mbart": lambda: T.MBartForConditionalGeneration(T.MBartConfig(max_position_embeddings=32, **BART)),
    "pegasus": lambda: T.PegasusForConditionalGeneration(T.PegasusConfig(max_position_embeddings=32, **BART)),
    # ALBERT: an embedding space of its own (embedding_size 16 ≠ hidden 32), layers shared across depth
    "albert_mlm": lambda: T.AlbertForMaskedLM(T.AlbertConfig(**_BERT | {"embedding_size": 16, "num_hidden_layers": 3})),
    "albert_cls_groups": lambda: T.AlbertForSequenceClassification(T.AlbertConfig(**_BERT | {
        "embedding_size": 16, "num_labels": 3, "num_hidden_layers": 4, "num_hidden_groups": 2, "inner_group_num": 2})),
    "albert_base": lambda: T.AlbertModel(T.AlbertConfig(embedding_size=16, **_BERT)),
    # DeBERTa: disentangled attention (v3: shared Q/K projections of the position table; v2: pos_*_proj)
    "deberta_v3_mlm": lambda: T.DebertaV2ForMaskedLM(T.DebertaV2Config(**_BERT | _DEBERTA_V3)),
    "deberta_v3_cls": lambda: T.DebertaV2ForSequenceClassification(T.DebertaV2Config(**_BERT | _DEBERTA_V3, num_labels=3)),
    "deberta_v2_pos_proj": lambda: T.DebertaV2ForTokenClassification(T.DebertaV2Config(
        **_BERT, num_labels=3, relative_attention=True, pos_att_type=["p2c", "c2p"], max_relative_positions=16,
        type_vocab_size=2)),
    # multi-head latent attention (v_head_dim ≠ qk_nope_head_dim; DeepSeek: every layer dense)
    "minicpm3": lambda: T.MiniCPM3ForCausalLM(T.MiniCPM3Config(**_LM | _MLA)),
    "deepseek_v2_no_q_latent": lambda: T.DeepseekV2ForCausalLM(T.DeepseekV2Config(
        **_LM | _MLA | {"q_lora_rank": None, "first_k_dense_replace": 2})),
    "deepseek_v3": lambda: T.DeepseekV3ForCausalLM(T.DeepseekV3Config(**_LM | _MLA | {"first_k_dense_replace": 2})),
    # MobileBERT: bottlenecks (intra 16, shared Q/K input 16), trigram embeddings (16 → 32), NoNorm
    "mobilebert_mlm": lambda: T.MobileBertForMaskedLM(T.MobileBertConfig(**_BERT | _MOBILEBERT)),
    "mobilebert_cls": lambda: T.MobileBertForSequenceClassification(T.MobileBertConfig(**_BERT | _MOBILEBERT,
                                                                                        num_labels=3)),
    "mobilebert_base": lambda: T.MobileBertModel(T.MobileBertConfig(**_BERT | _MOBILEBERT)),
    # transformers' ConvNeXt: one channel space per stage
    "convnext": lambda: T.ConvNextForImageClassification(T.ConvNextConfig(
        hidden_sizes=[8, 16], depths=[2, 1], num_stages=2, num_labels=5, image_size=16)),
    "convnext_base": lambda: T.ConvNextModel(T.ConvNextConfig(hidden_sizes=[8, 16, 24], depths=[1, 1, 1], num_stages=3,
                                                              image_size=32)),
    # Swin: one channel space per stage (patch merging 4·C → 2·C), per-head relative position bias columns
    "swin": lambda: T.SwinForImageClassification(T.SwinConfig(image_size=8, patch_size=2, embed_dim=8, depths=[1, 2],
                                                             num_heads=[2, 4], window_size=2, num_labels=5)),
    "swin_base_abs_pos": lambda: T.SwinModel(T.SwinConfig(image_size=8, patch_size=2, embed_dim=8, depths=[2, 1],
                                                          num_heads=[2, 2], window_size=2, use_absolute_embeddings=True)),
    "whisper": lambda: T.WhisperForConditionalGeneration(T.WhisperConfig(
        num_mel_bins=8, max_source_positions=8, max_target_positions=16, **BART)),
}
NAMES = list(TINY)
NO_FFN = {  # families without an FFN role (test_hf_mamba.py runs the common checks on them)
    "mamba": lambda: T.MambaForCausalLM(T.MambaConfig(vocab_size=50, hidden_size=32, state_size=4, num_hidden_layers=2,
                                                      conv_kernel=3, time_step_rank=5, pad_token_id=0)),
    "mamba_base": lambda: T.MambaModel(T.MambaConfig(vocab_size=50, hidden_size=32, state_size=4, num_hidden_layers=2,
                                                     conv_kernel=3, time_step_rank=5, use_conv_bias=False)),
}

_MOE = {**_LM, "num_key_value_heads": 2, "num_experts_per_tok": 2}
MOE = {  # Mixture-of-Experts decoders: 4 experts of 16 hidden units, top-2 (modeconn/symmetry/hf/moe.py)
    "mixtral": lambda: T.MixtralForCausalLM(T.MixtralConfig(num_local_experts=4, **{**_MOE, "intermediate_size": 16})),
    "qwen2_moe": lambda: T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(
        num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=24, **_MOE)),
    "qwen3_moe": lambda: T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(num_experts=4, moe_intermediate_size=16, head_dim=8,
                                                                 **_MOE)),
    "olmoe": lambda: T.OlmoeForCausalLM(T.OlmoeConfig(num_experts=4, **{**_MOE, "intermediate_size": 16})),
    "granitemoe": lambda: T.GraniteMoeForCausalLM(T.GraniteMoeConfig(
        num_local_experts=4, embedding_multiplier=3.0, residual_multiplier=0.5, logits_scaling=2.0,
        **{**_MOE, "intermediate_size": 16})),
    # variants: a dense layer between sparse ones (Qwen's mlp_only_layers), OLMoE's clip_qkv
    "qwen2_moe_dense_layer": lambda: T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(
        num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=24, mlp_only_layers=[1], **_MOE)),
    "olmoe_clip_qkv": lambda: T.OlmoeForCausalLM(T.OlmoeConfig(num_experts=4, clip_qkv=0.5,
                                                               **{**_MOE, "intermediate_size": 16})),
}
MOE_NAMES = list(MOE)


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter random (norm scales around 1), so that a missing binding shows in the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            for name, p in m.named_parameters(recurse=False):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
                if name == "weight" and (isinstance(m, nn.LayerNorm) or hasattr(m, "variance_epsilon")) \
                        and "Gemma" not in type(m).__name__:  # Gemma's RMSNorm scales by 1 + w
                    p.add_(1.0)
    return model.eval()


def make(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return randomize((TINY | NO_FFN | MOE)[name](), seed)


def outputs(model: nn.Module, x: dict) -> dict[str, torch.Tensor]:
    """logits if the model has them, else last_hidden_state and pooler_output."""
    with torch.no_grad():
        out = model.eval()(**x)
    keys = ("logits",) if "logits" in out else ("last_hidden_state", "pooler_output")
    return {k: out[k] for k in keys if out.get(k) is not None}


def loaded(model: nn.Module, sd: dict) -> nn.Module:
    import copy

    m = copy.deepcopy(model)
    m.load_state_dict(sd)
    return m.eval()


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def digest(model: nn.Module) -> tuple:
    sd = model.state_dict()
    return tuple((k, t.dtype, tuple(t.shape), t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
                 for k, t in sd.items()), tuple(type(m).__name__ for m in model.modules())


def resave(directory, seed: int = 3, **changes) -> None:
    """The causal LM of ``directory``'s config with ``changes`` (e.g. ``tie_word_embeddings=True``: no
    ``lm_head.weight`` stored), random, saved over its config and weights; its tokenizer files stay."""
    cfg = T.AutoConfig.from_pretrained(directory)
    for key, value in changes.items():
        setattr(cfg, key, value)
    torch.manual_seed(seed)
    randomize(T.AutoModelForCausalLM.from_config(cfg), seed).save_pretrained(directory)


def drop_stored(directory, key: str) -> None:
    """Remove tensor ``key`` from ``directory``'s ``model.safetensors`` (the config still expects it)."""
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    tensors = load_file(path)
    del tensors[key]
    save_file(tensors, path, metadata={"format": "pt"})

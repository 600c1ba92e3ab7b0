"""Tiny random models of every causal-LM type the installed transformers registers, for the
compatibility suite (``python -m eval compat``) and the tests' per-cache-kind representatives.

A type's tiny config is its own config class built with small sizes, the way transformers' model
testers build theirs (``CausalLMModelTester``: 2 layers, 32 wide, vocabulary 99): each size is
passed only where the config's constructor names it, so a type nobody listed gets the same
treatment. Per-layer patterns (``layer_types``, ``hybrid_override_pattern``, ...) are cut to the
new depth keeping one layer of every kind, and composite configs (a text and a vision part) get
their parts shrunk the same way. ``OVERRIDES`` holds what the generic rule cannot know for a
type (values read from that type's tester); it is a fallback table, not a list of what runs.
"""

from __future__ import annotations

import inspect
import re

import torch

# CausalLMModelTester's sizes, and the same sizes under the other names configs use. MLP widths are
# multiples of 16 (MoE grouped matmuls need 16-byte strides).
SIZES = {
    "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 512,
    "type_vocab_size": 16, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 16, "rotary_dim": 8,
    # mixture of experts
    "moe_intermediate_size": 16, "shared_expert_intermediate_size": 32, "num_experts_per_tok": 2,
    "num_experts_per_token": 2, "top_k_experts": 2, "num_experts": 8, "n_routed_experts": 8, "num_local_experts": 8,
    "num_shared_experts": 1, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    # Mamba / SSM mixers
    "mamba_n_groups": 1, "mamba_n_heads": 16, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
    "mamba_chunk_size": 16, "state_size": 16, "ssm_state_size": 16, "expand": 2, "conv_kernel": 4, "time_step_rank": 8,
    # linear-attention layers
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_num_heads": 4,
    # multi-head latent attention (DeepSeek-V2/V3 family) and its sparse-attention indexer
    "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
    "index_head_dim": 16, "index_n_heads": 2, "index_num_heads": 1,
    # sliding-window layers sized apart, per-layer embeddings (Gemma 3n/4), an LM head narrower than
    # the padded embedding
    "swa_num_attention_heads": 2, "swa_num_key_value_heads": 2, "swa_head_dim": 16,
    "vocab_size_per_layer_input": 99, "hidden_size_per_layer_input": 16, "unpadded_vocab_size": 99,
    # GPT-2 / OPT / T5 / CTRL / XLM-style names
    "n_embd": 32, "emb_dim": 32, "n_layer": 2, "n_head": 2, "n_positions": 512, "n_ctx": 512, "n_inner": 64,
    "d_model": 32, "num_layers": 2, "num_heads": 2, "d_ff": 64, "ffn_dim": 64, "d_kv": 16, "dim_ff": 64, "dff": 64,
    "dim_head": 16, "decoder_layers": 2, "decoder_attention_heads": 2, "decoder_ffn_dim": 64,
    "encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "kv_channels": 16,
    "word_embed_proj_dim": 32, "embed_dim": 32, "hidden_dim": 64, "ffn_hidden_size": 64,
    # a vision or audio part's output feeds the 32-wide text part
    "adapter_in_dim": 32, "adapter_out_dim": 32, "adapter_input_size": 32, "out_hidden_size": 32,
    "text_hidden_size": 32,
}

# Names the generic rule must not touch for a type, or values it must use: read from that type's
# tester in transformers' tests/models/<type>/test_modeling_<type>.py.
OVERRIDES: dict[str, dict] = {
    # Hybrids whose default config has one layer kind only, or sets its pattern by period.
    "bamba": {"attn_layer_indices": [1]},  # default: all Mamba layers
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},  # default: all Mamba
    "lfm2": {"layer_types": ["conv", "full_attention"]},  # default: attention only
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},  # no default pattern
    # Per-layer RoPE keyed by layer kind, empty by default.
    "cohere_compass_text": {"layer_types": ["sliding_attention", "full_attention"], "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8}},  # read by the attention, no defaults
    "musicgen": {"decoder": {"num_codebooks": 1, "decoder_start_token_id": 1}},  # (batch, length) prompt
    "musicgen_melody": {"decoder": {"num_codebooks": 1, "decoder_start_token_id": 1}},
    # The last layers reuse the KV of earlier ones: two of each kind, the last two sharing.
    "gemma3n_text": {"num_hidden_layers": 4, "num_kv_shared_layers": 2,
                     "layer_types": ["sliding_attention", "full_attention"] * 2},
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},  # its pattern in its own run-length form
    # Drafter heads: no per-layer inputs, no MoE (validated).
    "gemma4_assistant": {"text_config": {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
                                         "enable_moe_block": False, "use_double_wide_mlp": False}},
    # The sliding layers' MLA sizes come as popped "swa_" keywords (64 heads, rank 1024 by default).
    "dots3_note_text": {"swa_num_attention_heads": 2, "swa_num_key_value_heads": 2, "swa_q_lora_rank": 32,
                        "swa_kv_lora_rank": 16, "swa_head_dim": 32, "swa_qk_nope_head_dim": 16, "swa_v_head_dim": 16},
    "mimo_v2_flash": {"num_attention_heads": 4, "num_key_value_heads": 1},  # sliding layers double KV heads
    # Its query-sparse attention indexer has no defaults; hyper-connections default to rank 320.
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 16,
                       "indexer_compress_ratio": 4, "hc_lowrank": 16},
    # Layers named by kind; axial position embeddings: dims sum to the width, shape multiplies to positions.
    # num_buckets: None sizes the LSH buckets only in training (a prompt past one chunk fails in eval).
    "reformer": {"attn_layers": ["local", "lsh"], "axial_pos_shape": [16, 32], "axial_pos_embds_dim": [16, 16],
                 "attention_head_size": 16, "feed_forward_size": 64, "num_buckets": 2},
    "zaya": {"num_experts_per_tok": 1},  # top-1 routing only (validated)
    "xmod": {"default_language": "en_XX"},  # its per-language adapters need a language
    "nemotron_h": {"mamba_num_heads": 8, "mamba_head_dim": 8, "n_groups": 1, "chunk_size": 16},  # 8 x 8 = 2 x 32
    # Glyph-shape and pronunciation embeddings beside the token one.
    "roc_bert": {"shape_vocab_size": 99, "shape_embed_dim": 32, "pronunciation_vocab_size": 99,
                 "pronunciation_embed_dim": 32},
    # Multimodal RoPE whose sections only the modeling code knows (the generic rule reads the config's).
    "paddleocr_vl": {"text_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0,
                                                         "mrope_section": [2, 3, 3]}}},
    # Composite parts whose defaults disagree with the shrunk neighbours they are validated against.
    "molmo2": {"adapter_config": {"vision_feature_layer": [-1]}},  # default: layers 24 and 18
    "nemotron_h_omni": {"vision_config": {"video_temporal_patch_size": 2}},
    # Tied shared transformer needs two hybrid layers to tie.
    "zamba": {"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"]},
    "mamba2": {"num_heads": 4, "n_groups": 1, "chunk_size": 16},  # heads * head_dim = expand * hidden
    # The cache rounds q/k and v widths up to 64: make them exactly 64.
    "xlstm": {"hidden_size": 64, "embedding_dim": 64, "qk_dim_factor": 1.0, "chunk_size": 16},
    # Reads the sizes its tester sets on the config after building it (the cache is sized by them).
    "blt": {"encoder_hash_byte_group_vocab": 1000, "encoder_config": {"hidden_size_global": 32},
            "decoder_config": {"hidden_size_global": 32}, "num_hidden_layers": 2, "num_attention_heads": 2,
            "hidden_size": 32},
    # Maps image tokens to BPE ids; no default (a text-only prompt needs only "<image>").
    "chameleon": {"vocabulary_map": {"<image>": 98}},
    "deepseek_ocr2": {"text_config": {"mlp_layer_types": ["dense", "sparse"]}},  # no default, read per layer
    # Its Q-Former has vision width // 64 heads; one deepstack injection (tester's values).
    "granite4_vision": {"vision_config": {"hidden_size": 64}, "downsample_rate": "1/2",
                        "deepstack_layer_map": [[1, 0]]},
    # The audio encoder's pyramid: one stage per "layer", all lists that long.
    "muse_spark_audio": {"num_hidden_layers": 2, "patch_sizes": [4, 4], "hidden_sizes": [16, 32], "depths": [1, 1]},
    "wavtokenizer_encoder": {"codebook_dim": 32},  # no projection around its quantizer: = its width
    # Image then audio codebook tokens at the top of the vocabulary, which must hold both.
    "apertus1p5": {"image_token_id": 56, "audio_token_id": 57, "image_token_offset": 60, "audio_token_offset": 76,
                   "vision_config": {"codebook_size": 16}, "audio_config": {"codebook_size": 16}},
    "step3p7": {"text_config": {"sliding_window": 16}},  # sliding layers, no default window
    # The thinker's multimodal RoPE reads a vision-start token its config does not define.
    "qwen2_5_omni_thinker": {"vision_start_token_id": 97},
    "qwen3_omni_moe_thinker": {"vision_start_token_id": 97},
    # Encoder-decoders whose decoder start token is not set or lies past the shrunk vocabulary.
    "t5": {"decoder_start_token_id": 0},
    "marian": {"decoder_start_token_id": 0},
    "switch_transformers": {"decoder_start_token_id": 0, "num_decoder_layers": 2, "decoder_sparse_step": 1,
                            "encoder_sparse_step": 1},  # every layer sparse: two of them, not 12
}

# Types whose plain generate() cannot decode a text-only prompt, for a reason no attribute of the
# model says (those that do: no generate(), or a main input other than input_ids; see
# text_only_reason), read from the type's modeling code.
NOT_TEXT_ONLY: dict[str, str] = {
    "idefics": "its forward needs pixel_values, image_encoder_embeddings or perceiver_embeddings (an image)",
    "udop": "its encoder needs bbox (the layout box of every word of a document) beside input_ids",
    "gemma4_assistant": "a drafter head: its forward takes the target model's shared_kv_states and inputs_embeds",
    "gemma4_unified_assistant": "a drafter head: its forward takes the target model's shared_kv_states and "
                                "inputs_embeds",
}

_PATTERN_NAMES = ("layer_types", "layers_block_type", "hybrid_override_pattern", "block_types", "attn_layer_indices",
                  "mlp_only_layers", "layers_type", "mlp_layer_types")
_WIDE = re.compile(r"(intermediate|ffn).*(size|dim)$")


def tiny_config(model_type: str, overrides: dict | None = None):
    """The config of a tiny random ``model_type`` model (2 layers of each kind, 32 wide)."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    extra = {**OVERRIDES.get(model_type, {}), **(overrides or {})}
    return _shrink(config_class, extra)


def _shrink(config_class, extra: dict):
    names = set(inspect.signature(config_class.__init__).parameters) - {"self", "kwargs"}
    try:
        default = config_class()
    except Exception:  # the type rejects its own defaults: its overrides make them valid
        default = config_class(**extra)
    kwargs = {k: _like(config_class, k, v, _get(default, k)) for k, v in SIZES.items()
              if k in names and _get(default, k) != 0}  # a size of 0 turns a part off: kept
    for name, _sub_class in (getattr(config_class, "sub_configs", None) or {}).items():
        sub_default = getattr(default, name, None)
        if sub_default is None or not isinstance(extra.get(name, {}), dict):
            continue
        # a part gets its own type's overrides (a composite's text part is often a type of its own)
        sub_extra = {**OVERRIDES.get(getattr(sub_default, "model_type", None), {}), **extra.get(name, {})}
        kwargs[name] = _shrink(type(sub_default), sub_extra).to_dict()
    for name in names - kwargs.keys():
        value = _get(default, name)
        if type(value) is int and value > 64 and _WIDE.search(name):  # other MLP widths (shared, dense, ...)
            kwargs[name] = 64
        if name.endswith("_layer_period") and name[:-6] + "offset" in names:  # "attention every 8th layer"
            kwargs[name], kwargs[name[:-6] + "offset"] = 2, 1
    rope = getattr(default, "rope_parameters", None)
    mrope = "mrope_section" in getattr(config_class, "ignore_keys_at_rope_validation", ())
    if isinstance(rope, dict) and (mrope or rope.get("mrope_section")) and "rope_parameters" not in extra:
        # multimodal RoPE: its (time, height, width) sections of the rotary half, rescaled; where only
        # the modeling code holds them, an even split (some types need height = width)
        size = {k: kwargs.get(k, _get(default, k)) for k in SIZES}
        head = size["head_dim"] or size["hidden_size"] // size["num_attention_heads"]
        rotary = size.get("qk_rope_head_dim") or int(head * rope.get("partial_rotary_factor", 1.0))
        sections = _rescale(rope.get("mrope_section") or [1, 1, 1], rotary // 2)
        kwargs["rope_parameters"] = {**rope, "mrope_section": sections}
    depth = kwargs.get("num_hidden_layers", kwargs.get("n_layer", kwargs.get("num_layers")))
    old_depth = getattr(default, "num_hidden_layers", None)
    for name in _PATTERN_NAMES:
        pattern = getattr(default, name, None)
        if name in names and pattern is not None and depth is not None and name not in extra:
            kwargs[name], depth = _cut_pattern(pattern, depth, old_depth)
    if depth is not None:
        for key in ("num_hidden_layers", "n_layer", "num_layers"):
            if key in kwargs:
                kwargs[key] = depth
    kwargs.update({k: v for k, v in extra.items() if not isinstance(v, dict) or k not in kwargs})
    return config_class(**kwargs)


def _get(config, name: str):
    """``config.name``, or None (also where a per-layer config refuses a global read)."""
    try:
        return getattr(config, name, None)
    except Exception:
        return None


def _like(config_class, name: str, value, default):
    """``value`` as a per-stage list where the field takes only lists (a vision tower's widths)."""
    fields = getattr(config_class, "__dataclass_fields__", {})
    annotation = str(fields[name].type) if name in fields else ""
    if isinstance(default, (list, tuple)) and "int" not in re.sub(r"(list|tuple)\[int(, \.\.\.)?\]", "", annotation):
        return [value] * len(default)
    return value


def _rescale(sections, total: int) -> list[int]:
    """``sections`` scaled to sum to ``total`` (the last one takes the rounding)."""
    scaled = [max(1, s * total // sum(sections)) for s in sections[:-1]]
    return scaled + [total - sum(scaled)]


def _cut_pattern(pattern, depth: int, old_depth):
    """A per-layer pattern (list or string) cut to ``depth`` layers keeping the first layer of
    every kind, in order; the depth grows when there are more kinds than layers."""
    if isinstance(pattern, (list, tuple)) and pattern and all(isinstance(p, int) for p in pattern) \
            and old_depth and len(pattern) != old_depth:
        return [p for p in pattern if p < depth][:depth] or [0], depth  # layer indices, not a pattern
    kinds, keep = set(), []
    for i, kind in enumerate(pattern):
        if kind not in kinds:
            kinds.add(kind)
            keep.append(i)
    depth = max(depth, len(keep))
    for i in range(len(pattern)):
        if len(keep) >= depth:
            break
        if i not in keep:
            keep.append(i)
    keep.sort()
    cut = [pattern[i] for i in keep]
    return ("".join(cut) if isinstance(pattern, str) else type(pattern)(cut)), depth


def tiny_model(model_type: str, dtype=torch.float32, seed: int = 0, kind: str = "causal", **config_overrides):
    """A tiny random ``model_type`` model in eval mode: its AutoModelForCausalLM class (``kind``
    "causal"), image-text-to-text class ("image-text", for a type that has no causal-LM class)
    or encoder-decoder class ("seq2seq")."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSeq2SeqLM

    config = tiny_config(model_type, config_overrides)
    auto = {"causal": AutoModelForCausalLM, "image-text": AutoModelForImageTextToText,
            "seq2seq": AutoModelForSeq2SeqLM}[kind]
    model_class = auto._model_mapping[type(config)]
    if not isinstance(config, model_class.config_class):  # the class takes a part (MusicGen's decoder)
        parts = (getattr(config, name, None) for name in getattr(config, "sub_configs", None) or {})
        config = next((part for part in parts if isinstance(part, model_class.config_class)), config)
    if kind != "seq2seq":
        config.is_decoder = True  # encoder families (BERT, RoBERTa, ...) are causal only as decoders
    torch.manual_seed(seed)
    model = model_class._from_config(config, dtype=dtype)
    gc = getattr(model, "generation_config", None)
    if gc is not None and gc.num_return_sequences is None:  # a generate() of its own reads it unmerged (MusicGen)
        gc.num_return_sequences = 1
    return model.eval()


def text_only_reason(model) -> str | None:
    """Why plain ``generate()`` cannot decode a text-only prompt on ``model`` (it needs an image,
    or is no token generator), or None."""
    from transformers import GenerationMixin

    if not isinstance(model, GenerationMixin):
        return f"{type(model).__name__} has no generate(): it is not a token generator"
    name = getattr(model, "main_input_name", "input_ids")
    if name != "input_ids":
        return f"{type(model).__name__}'s generate() starts from {name} (an image), not from a text prompt"
    return NOT_TEXT_ONLY.get(getattr(model.config, "model_type", None))


def model_types() -> tuple[list[str], list[str], list[str]]:
    """(causal-LM types, image-text-to-text types with no causal-LM class, encoder-decoder
    text-to-text types) of the installed transformers, sorted. (transformers files some
    decoder-only speech models under text-to-text too: those are not encoder-decoders.)"""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    causal = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    image_text = sorted(set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES) - set(causal))
    seq2seq = sorted(t for t in set(MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES) - set(image_text)
                     if _is_encoder_decoder(t))
    return causal, image_text, seq2seq


def _is_encoder_decoder(model_type: str) -> bool:
    from transformers import CONFIG_MAPPING

    try:
        return bool(CONFIG_MAPPING[model_type]().is_encoder_decoder)
    except Exception:  # noqa: BLE001 - a config that rejects its own defaults: its tiny config says
        try:
            return bool(tiny_config(model_type).is_encoder_decoder)
        except Exception:  # noqa: BLE001
            return False

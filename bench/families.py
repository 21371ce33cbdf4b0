"""Decoder families at the sizes of released models, random fp32 weights (bench/decode.py
--family): layers truncated to fit this machine (--layers), or at the released depth
(--released-depth), where the head's share of a step's bytes is the one users meet (a 4-layer
Gemma 3 1B spends 83% of its w4a8 bytes on the tied 262k-row head, the 26-layer model 43%). Each
states the model its widths come from; the vocabulary, head counts and each family's own forms
(windows, softcaps, multipliers, fused projections, partial rotary) are the released
configuration's."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GraniteConfig,
    GraniteForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedModel,
)


def _build(cls: type, cfg) -> PreTrainedModel:
    torch.manual_seed(0)
    return cls(cfg).eval()


def gemma3(layers: int) -> PreTrainedModel:
    """Gemma 3 1B (google/gemma-3-1b-pt): 5 sliding layers of 512 to each global one."""
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
    cfg = Gemma3TextConfig(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
        sliding_window=512, layer_types=types, max_position_embeddings=32768,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
        tie_word_embeddings=True, eos_token_id=None, pad_token_id=0, bos_token_id=2)
    return _build(Gemma3ForCausalLM, cfg)


def phi3(layers: int) -> PreTrainedModel:
    """Phi-3-mini-4k-instruct (microsoft): fused qkv_proj and gate_up_proj."""
    cfg = Phi3Config(vocab_size=32064, hidden_size=3072, intermediate_size=8192,
                     num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=32,
                     max_position_embeddings=4096, tie_word_embeddings=False, eos_token_id=None,
                     pad_token_id=32000, bos_token_id=1)
    return _build(Phi3ForCausalLM, cfg)


def olmo2(layers: int) -> PreTrainedModel:
    """OLMo 2 1B (allenai/OLMo-2-0425-1B): post-norms, whole-projection q/k norms."""
    cfg = Olmo2Config(vocab_size=100352, hidden_size=2048, intermediate_size=8192,
                      num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=16,
                      max_position_embeddings=4096, rope_parameters={"rope_type": "default",
                                                                     "rope_theta": 500000.0},
                      tie_word_embeddings=False, eos_token_id=None, pad_token_id=100277,
                      bos_token_id=None)
    return _build(Olmo2ForCausalLM, cfg)


def granite(layers: int) -> PreTrainedModel:
    """Granite 3.1 2B (ibm-granite/granite-3.1-2b-instruct): its four multipliers."""
    cfg = GraniteConfig(vocab_size=49155, hidden_size=2048, intermediate_size=8192,
                        num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
                        max_position_embeddings=4096, embedding_multiplier=12.0,
                        residual_multiplier=0.22, attention_multiplier=0.015625,
                        logits_scaling=8.0, tie_word_embeddings=True, eos_token_id=None,
                        pad_token_id=0, bos_token_id=0)
    return _build(GraniteForCausalLM, cfg)


# Each family's builder, the released model it has the widths of, and that model's depth.
FAMILIES: dict[str, tuple[Callable[[int], PreTrainedModel], str, int]] = {
    "gemma3": (gemma3, "Gemma 3 1B (26 layers)", 26),
    "phi3": (phi3, "Phi-3-mini-4k (32 layers)", 32),
    "olmo2": (olmo2, "OLMo 2 1B (16 layers)", 16),
    "granite": (granite, "Granite 3.1 2B (40 layers)", 40),
}

"""Hosts with gated delta rule layers (issue 27), built from their transformers config classes
with random weights: Qwen3.5 dense and MoE and Qwen3-Next, small widths, three linear-attention
layers and one full-attention layer, grouped value heads (more value heads than key heads) as
the released models have."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import (
    PreTrainedModel,
    Qwen3_5ForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

VOCAB = 512
LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]


def _common(**kw) -> dict:
    base = dict(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=48,
                linear_conv_kernel_dim=4, layer_types=LAYER_TYPES, max_position_embeddings=512,
                pad_token_id=0, bos_token_id=1, eos_token_id=None)
    base.update(kw)
    return base


def qwen35(dtype: torch.dtype = torch.float32) -> Qwen3_5ForCausalLM:
    torch.manual_seed(31)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**_common(intermediate_size=512))).eval()
    return model.to(dtype)


def qwen35_moe() -> Qwen3_5MoeForCausalLM:
    torch.manual_seed(32)
    cfg = Qwen3_5MoeTextConfig(**_common(num_experts=8, num_experts_per_tok=2,
                                         moe_intermediate_size=128,
                                         shared_expert_intermediate_size=256))
    return Qwen3_5MoeForCausalLM(cfg).eval()


def qwen3_next() -> Qwen3NextForCausalLM:
    torch.manual_seed(33)
    cfg = Qwen3NextConfig(**_common(intermediate_size=512, num_experts=8, num_experts_per_tok=2,
                                    moe_intermediate_size=128,
                                    shared_expert_intermediate_size=256))
    return Qwen3NextForCausalLM(cfg).eval()


FAMILIES: dict[str, Callable[[], PreTrainedModel]] = {
    "qwen3_5": qwen35, "qwen3_5_moe": qwen35_moe, "qwen3_next": qwen3_next}

"""Routed-MoE hosts built from their transformers config classes with random weights: small
widths, banks large enough that every one is past the catalog's accounting size."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    GptOssConfig,
    GptOssForCausalLM,
    Llama4ForCausalLM,
    Llama4TextConfig,
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

import hosts
from hosts import VOCAB

_COMMON = dict(vocab_size=VOCAB, hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=256)


def qwen3_moe(layers: int = 2, **kw) -> Qwen3MoeForCausalLM:
    torch.manual_seed(10)
    cfg = Qwen3MoeConfig(**_COMMON, head_dim=64, num_hidden_layers=layers, intermediate_size=512,
                         moe_intermediate_size=128, num_experts=16, num_experts_per_tok=4,
                         norm_topk_prob=kw.pop("norm_topk_prob", True), **kw)
    return Qwen3MoeForCausalLM(cfg).eval()


def qwen2_moe(layers: int = 2) -> Qwen2MoeForCausalLM:
    torch.manual_seed(11)
    cfg = Qwen2MoeConfig(**_COMMON, num_hidden_layers=layers, intermediate_size=512,
                         moe_intermediate_size=128, shared_expert_intermediate_size=256,
                         num_experts=16, num_experts_per_tok=4)
    return Qwen2MoeForCausalLM(cfg).eval()


def mixtral(layers: int = 2) -> MixtralForCausalLM:
    torch.manual_seed(12)
    cfg = MixtralConfig(**_COMMON, num_hidden_layers=layers, intermediate_size=192,
                        num_local_experts=12, num_experts_per_tok=2)
    return MixtralForCausalLM(cfg).eval()


def olmoe(layers: int = 2) -> OlmoeForCausalLM:
    torch.manual_seed(13)
    cfg = OlmoeConfig(**_COMMON, num_hidden_layers=layers, intermediate_size=128,
                      num_experts=16, num_experts_per_tok=4)
    return OlmoeForCausalLM(cfg).eval()


def gpt_oss(layers: int = 2) -> GptOssForCausalLM:
    """Transposed banks with per-expert biases and a clamped gate: refused by the boundary."""
    torch.manual_seed(14)
    cfg = GptOssConfig(**_COMMON, head_dim=64, num_hidden_layers=layers, intermediate_size=128,
                       num_local_experts=8, num_experts_per_tok=2, sliding_window=128,
                       layer_types=["sliding_attention", "full_attention"][:layers])
    return GptOssForCausalLM(cfg).eval()


def llama4(layers: int = 2) -> Llama4ForCausalLM:
    """Banks stored [experts, in, out] and a router that is an nn.Linear."""
    torch.manual_seed(15)
    cfg = Llama4TextConfig(**_COMMON, head_dim=64, num_hidden_layers=layers, intermediate_size=128,
                           intermediate_size_mlp=512, num_local_experts=8, num_experts_per_tok=1)
    return Llama4ForCausalLM(cfg).eval()


FAMILIES = {"qwen3_moe": qwen3_moe, "qwen2_moe": qwen2_moe, "mixtral": mixtral, "olmoe": olmoe}


def step_asking_for_router_logits(model, plan) -> tuple[Any, Any, dict[str, dict]]:
    """One decode step after a 6-token prompt with output_router_logits=True: the host's output,
    the output with `plan` attached, and the attached run's ledger by site."""
    prompt = hosts.ids(6, seed=3)

    def step() -> Any:
        with torch.no_grad():
            past = model(prompt, use_cache=True).past_key_values
            return model(hosts.ids(1), past_key_values=past, use_cache=True,
                         output_router_logits=True)

    want = step()
    handle = plan.attach(model)
    try:
        got = step()
        report = {r["site"]: r for r in handle.report()}
    finally:
        handle.detach()
    return want, got, report

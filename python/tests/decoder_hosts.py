"""Decoder families decode_loop binds beyond Llama (issue 28), built from their config classes
in transformers with random fp32 weights: small widths, but each family's own forms switched on
(sliding windows shorter than the runs, softcaps, multipliers, rotary-free layers, a partial
rotary, fused projections), so a run past the window exercises them."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GraniteConfig,
    GraniteForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedModel,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

VOCAB = 512
WINDOW = 8  # sliding layers' window: every run here goes past it


def _common(**kw) -> dict:
    # eos None: the host's generate must not suppress a stop token the loop would pick.
    base = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                pad_token_id=0, bos_token_id=1, eos_token_id=None)
    base.update(kw)
    return base


def gemma2() -> Gemma2ForCausalLM:
    """Sliding and global layers alternating, attention and final logit softcapping, x*(1+w)
    norms before and after each sublayer, the embedding scaled by sqrt(hidden)."""
    torch.manual_seed(20)
    return Gemma2ForCausalLM(Gemma2Config(**_common(head_dim=64, sliding_window=WINDOW))).eval()


def gemma3() -> Gemma3ForCausalLM:
    """Per-head q/k norms, local and global rotary bases, query_pre_attn_scalar."""
    torch.manual_seed(21)
    cfg = Gemma3TextConfig(**_common(
        head_dim=64, sliding_window=WINDOW, query_pre_attn_scalar=48,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"]))
    return Gemma3ForCausalLM(cfg).eval()


def phi3(partial_rotary_factor: float = 1.0) -> Phi3ForCausalLM:
    """Fused qkv_proj and gate_up_proj; Phi-4-mini's partial rotary at 0.75."""
    torch.manual_seed(22)
    cfg = Phi3Config(**_common(partial_rotary_factor=partial_rotary_factor))
    return Phi3ForCausalLM(cfg).eval()


def phi4_mini() -> Phi3ForCausalLM:
    return phi3(0.75)


def olmo2() -> Olmo2ForCausalLM:
    """Norms after each sublayer (none before), q/k norms over the whole projection."""
    torch.manual_seed(23)
    return Olmo2ForCausalLM(Olmo2Config(**_common())).eval()


def granite() -> GraniteForCausalLM:
    """Embedding, residual, attention and logits multipliers (Granite 3's values)."""
    torch.manual_seed(24)
    cfg = GraniteConfig(**_common(embedding_multiplier=12.0, residual_multiplier=0.22,
                                  attention_multiplier=0.015625, logits_scaling=8.0))
    return GraniteForCausalLM(cfg).eval()


def smollm3() -> SmolLM3ForCausalLM:
    """Every other layer without rotary (NoPE)."""
    torch.manual_seed(25)
    return SmolLM3ForCausalLM(SmolLM3Config(**_common(no_rope_layer_interval=2))).eval()


FAMILIES: dict[str, Callable[[], PreTrainedModel]] = {
    "gemma2": gemma2, "gemma3": gemma3, "phi3": phi3, "phi4_mini": phi4_mini, "olmo2": olmo2,
    "granite": granite, "smollm3": smollm3,
}
BINDINGS = {"gemma2": "gemma_decode", "gemma3": "gemma_decode", "phi3": "phi3_decode",
            "phi4_mini": "phi3_decode", "olmo2": "olmo2_decode", "granite": "llama_decode",
            "smollm3": "llama_decode"}

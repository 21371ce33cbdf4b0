"""decode_loop over routed-MoE hosts (Qwen3-MoE with dense and routed layers, Qwen2-MoE with its
shared expert, Mixtral): greedy tokens against the host's own generate at fp32 and over the
weight-only seats (the loop reads the seated banks' packs; the router stays at the host's
precision), the router's form read from its own call, the self-check, blocked prefill, and the
hosts and forms it must refuse (GPT-OSS, a router or a bank computing something else)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from transformers import GptOssConfig, GptOssForCausalLM

import flashrt_structures as S

import hosts
import moe_hosts

warnings.filterwarnings("ignore", category=FutureWarning)

HOSTS = {
    # layer 0 dense (mlp_only_layers), layers 1-2 routed; the router renormalises or not
    "qwen3_moe_norm": lambda: moe_hosts.qwen3_moe(layers=3, mlp_only_layers=[0],
                                                  norm_topk_prob=True),
    "qwen3_moe_plain": lambda: moe_hosts.qwen3_moe(layers=3, mlp_only_layers=[0],
                                                   norm_topk_prob=False),
    "qwen2_moe": moe_hosts.qwen2_moe,  # a shared expert beside the bank
    "mixtral": moe_hosts.mixtral,  # renormalises with no config flag
}


def attached(model, scheme):
    """The seats of `scheme` attached (None: the host as it is); the handle or None."""
    if scheme is None:
        return None
    return S.auto_swaps(model, lambda: model(hosts.ids(1)), scheme=scheme).attach(model)


@pytest.mark.parametrize("scheme", [None, "w8a16_decode", "w4a16_decode"])
@pytest.mark.parametrize("name", list(HOSTS))
def test_greedy_tokens_equal_the_hosts_generate(name, scheme):
    """20 greedy steps after a 9-token prompt (prefilled in the core): the host's own generate
    runs whatever is attached, the loop reads the same packs, so the tokens agree."""
    model = HOSTS[name]()
    ids = hosts.ids(9, seed=4)
    handle = attached(model, scheme)
    try:
        loop = S.decode_loop(model, max_len=64)
        want = hosts.generate(model, ids, 20)
        got = loop.generate(ids, 20)
        div = hosts.first_divergence(model, got, want, 9)
    finally:
        if handle is not None:
            handle.detach()
    assert loop.self_check["verdict"] == "passed"
    assert loop.self_check["min_cosine"] >= 0.9999 and loop.self_check["min_keys_cosine"] >= 0.9999
    assert got.shape == want.shape == (1, 29)
    if div is not None:  # allowed only inside the rounding of two summation orders
        step, margin = div
        assert margin < 1e-4, f"diverged at step {step} with host top-2 margin {margin}"
    # What the plan made of each layer: read from the host, never assumed.
    cfg = model.config
    dense = set(getattr(cfg, "mlp_only_layers", []) or [])
    for i, layer in enumerate(loop.plan.layers):
        assert layer.routed == (i not in dense)
        if not layer.routed:
            continue
        moe = layer.moe
        assert moe.top_k == cfg.num_experts_per_tok
        assert moe.renormalise == getattr(cfg, "norm_topk_prob", True)  # Mixtral: always
        assert moe.bank_seated == (scheme is not None)
        assert moe.shared == (name == "qwen2_moe")
        assert moe.activation == S._core.Activation.silu
    assert "routed:" in S.explain(loop)


@pytest.mark.parametrize("scheme", [None, "w8a16_decode"])
def test_blocked_prefill_computes_what_token_by_token_prefill_does(scheme):
    """37 tokens as blocks of 16, 16 and 5 rows: several rows share an expert in a block."""
    model = moe_hosts.qwen2_moe()
    handle = attached(model, scheme)
    try:
        loop = S.decode_loop(model, max_len=48)
        tokens = hosts.ids(37, seed=11)[0].tolist()
        best = loop.program.prefill(tokens, 0)
        blocked = torch.from_numpy(loop.program.logits()).clone()
        for pos, tok in enumerate(tokens):
            one = loop.program.step(tok, pos)
        single = torch.from_numpy(loop.program.logits()).clone()
    finally:
        if handle is not None:
            handle.detach()
    assert best == one
    assert torch.allclose(blocked, single, rtol=1e-4, atol=1e-4), (blocked - single).abs().max()


def test_a_seated_bank_streams_its_top_k_experts():
    model = moe_hosts.qwen3_moe()
    base = S.decode_loop(model, max_len=16)
    handle = attached(model, "w8a16_decode")
    try:
        loop = S.decode_loop(model, max_len=16)
    finally:
        handle.detach()
    assert loop.weight_bytes < base.weight_bytes
    assert loop.seated > 2 and all(layer.moe.bank_seated for layer in loop.plan.layers)


def gpt_oss_full_attention() -> GptOssForCausalLM:
    """GPT-OSS without its sliding layers and with a plain rotary, so the plan reaches its
    feed-forward: transposed banks with biases, and a router with a bias."""
    torch.manual_seed(14)
    cfg = GptOssConfig(**moe_hosts._COMMON, head_dim=64, num_hidden_layers=2,
                       intermediate_size=128, num_local_experts=8, num_experts_per_tok=2,
                       sliding_window=None, layer_types=["full_attention"] * 2,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    return GptOssForCausalLM(cfg).eval()


def test_gpt_oss_is_refused_by_its_banks_and_its_router():
    # Its sliding layers and YaRN table are computed; its banks and router are not.
    with pytest.raises(S.Refused, match="transposed \\[experts, in, out\\] with per-expert biases"):
        S.decode_loop(moe_hosts.gpt_oss(), max_len=32)
    model = gpt_oss_full_attention()
    snap = hosts.snapshot(model)
    plan = S.decode.plan_decode(model, 32)
    assert not plan.ok
    refused = dict(plan.refused)
    bank = refused["model.layers.0.mlp.experts"]
    assert "GptOssExperts, 8 experts" in bank
    assert "transposed [experts, in, out] with per-expert biases" in bank
    router = refused["model.layers.0.mlp.gate"]
    assert "the bank's routing weight is held by model.layers.0.mlp.router" in router
    assert "GptOssTopKRouter) does not route as the top-k of softmax(x W^T)" in router
    assert "it holds bias beside its weight" in router
    with pytest.raises(S.Refused, match="GptOssExperts, 8 experts"):
        S.decode_loop(model, max_len=32)
    assert hosts.same_weights(model, snap)


class SigmoidRouter(nn.Module):
    """Routes by sigmoid scores (as DeepSeek-V3 scores its experts): not the top-k of a softmax."""

    def __init__(self, router: nn.Module):
        super().__init__()
        self.weight = router.weight
        self.top_k = router.top_k

    def forward(self, x):
        logits = nn.functional.linear(x.reshape(-1, self.weight.shape[1]), self.weight)
        scores, index = torch.sigmoid(logits).topk(self.top_k, dim=-1)
        return logits, scores, index


def test_a_router_that_computes_something_else_is_refused_by_what_its_call_showed():
    model = moe_hosts.qwen3_moe()
    for layer in model.model.layers:
        layer.mlp.gate = SigmoidRouter(layer.mlp.gate)
    with torch.no_grad():
        model(hosts.ids(3))  # the host runs with it
    plan = S.decode.plan_decode(model, 32)
    site, why = plan.refused[0]
    assert site == "model.layers.0.mlp.gate"
    assert why == ("model.layers.0.mlp.gate (SigmoidRouter) does not route as the top-k of "
                   "softmax(x W^T): its top-4 scores are neither softmax(x W^T)'s top-4 nor "
                   "those renormalised to sum to one")
    with pytest.raises(S.Refused, match="SigmoidRouter"):
        S.decode_loop(model, max_len=32)


def test_a_bank_whose_gated_form_the_loop_does_not_compute_is_refused():
    model = moe_hosts.qwen3_moe(hidden_act="relu")
    with pytest.raises(S.Refused, match=r"Qwen3MoeExperts\): act\(gate x\) \* up x with none of "
                                        r"\{silu, gelu_tanh\} reproduced its call"):
        S.decode_loop(model, max_len=32)


def test_a_bf16_moe_host_is_refused():
    with pytest.raises(S.Refused, match="host dtype bf16"):
        S.decode_loop(moe_hosts.mixtral().to(torch.bfloat16), max_len=32)


def test_olmoe_is_computed_with_its_whole_width_qk_norm():
    """OLMoE's q/k norms span all heads at once (the norm's width says so, as OLMo 2's)."""
    model = moe_hosts.olmoe()
    loop = S.decode_loop(model, max_len=48)
    assert all(lc.qk_norm == S._core.QkNorm.whole for lc in loop.plan.config.layer)
    ids = hosts.ids(9, seed=4)
    assert torch.equal(loop.generate(ids, 24, eos_token_id=[]), hosts.generate(model, ids, 24))

"""Rotary seats on real transformers hosts: rotary_embed replaces the rotary function attention
modules call (apply_rotary_pos_emb of their modeling file) for the calls carrying their model's
tables. Prompt then 32 greedy steps equal the host's with every call seated; detach puts the very
function back; calls the op does not take run the host's function, counted; an interleaved
pairing and a partial rotary are refused by form and shape."""

from __future__ import annotations

import pytest
import torch
from test_attention_norm import cosine, gemma3, greedy
from transformers import CohereConfig, CohereForCausalLM, Phi3Config, Phi3ForCausalLM
from transformers.models.qwen3 import modeling_qwen3

import flashrt_structures as S
from flashrt_structures import _core
from flashrt_structures.observe.rotary import measure_rotary

import gated_delta_hosts
import hosts

STRUCTURES = ["rotary_embed"]
FAMILIES = {"qwen3": lambda: hosts.qwen3(2), "llama": lambda: hosts.llama(2), "gemma3": gemma3}


def plan_for(model, structures=STRUCTURES):
    step = hosts.ids(1)
    return S.auto_swaps(model, [lambda: model(hosts.ids(6)), lambda: model(step)],
                        scheme="w8a16_decode", structures=structures)


def rotary_rows(report):
    return [r for r in report if r["structure"] == "rotary_embed"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_prompt_and_32_steps_equal_the_hosts_with_every_rotary_call_seated(family):
    model = FAMILIES[family]()
    layers = model.config.num_hidden_layers
    prompt = hosts.ids(8, seed=7)
    want = greedy(model, prompt, 32)
    snap = hosts.snapshot(model)
    plan = plan_for(model)
    seated = [sp for sp in plan.seams if sp.seam.structure == "rotary_embed"]
    assert len(seated) == 1 and seated[0].site.endswith("rotary_emb"), S.explain(plan)
    assert "rotary_embed q " in S.explain(plan)
    namespace = type(model.model.layers[0].self_attn).__module__
    module = __import__(namespace, fromlist=["apply_rotary_pos_emb"])
    original = module.apply_rotary_pos_emb
    handle = plan.attach(model)
    try:
        # The seat's dispatch stands there (over whatever stood before).
        assert getattr(module.apply_rotary_pos_emb, "_flashrt_original", None) is not None
        got = greedy(model, prompt, 32)
        report = handle.report()
    finally:
        handle.detach()
    assert module.apply_rotary_pos_emb is original
    assert torch.equal(got.sequences, want.sequences), family
    assert min(cosine(a, b) for a, b in zip(got.logits, want.logits)) >= 0.9999
    (row,) = rotary_rows(report)
    # Every layer's call, the prompt's and each step's, ran the seat (Gemma 3's sliding layers
    # carry the local table, its global layers the other one: both claimed).
    assert row["calls"] >= layers * 32 and row["fallbacks"] == 0, row
    assert hosts.same_weights(model, snap)


def test_every_family_together_still_equals_the_host():
    model = hosts.qwen3(2)
    prompt = hosts.ids(8, seed=3)
    want = greedy(model, prompt, 16)
    plan = plan_for(model, structures=None)
    assert {sp.seam.structure for sp in plan.seams} >= {"rotary_embed", "attention_core",
                                                         "norm_fused"}, S.explain(plan)
    handle = plan.attach(model)
    try:
        got = greedy(model, prompt, 16)
        (row,) = rotary_rows(handle.report())
    finally:
        handle.detach()
    assert torch.equal(got.sequences, want.sequences)
    assert row["calls"] >= 2 * 16 and row["fallbacks"] == 0, row


def test_calls_the_op_does_not_take_run_the_hosts_function_counted():
    model = hosts.qwen3(2)
    plan = plan_for(model)
    handle = plan.attach(model)
    try:
        cfg = model.config
        dim = cfg.head_dim
        q = torch.randn(1, cfg.num_attention_heads, 3, dim)
        k = torch.randn(1, cfg.num_key_value_heads, 3, dim)
        with torch.no_grad():
            model.model.rotary_emb(q, torch.arange(3)[None])  # its tables, as the model computes
            cos, sin = model.model.rotary_emb(q, torch.arange(3)[None])
        host = modeling_qwen3.apply_rotary_pos_emb._flashrt_original
        fallbacks = rotary_rows(handle.report())[0]["fallbacks"]
        # Halves that differ (not the rotate-half table), q needing grad, another layout: each
        # the host's own result, each counted.
        good_cos = cos.clone()
        cos[..., 0] += 1.0  # in place: still the tables the rotary module returned
        with pytest.warns(RuntimeWarning, match="halves differ"):
            got = modeling_qwen3.apply_rotary_pos_emb(q, k, cos, sin)
        want = host(q, k, cos, sin)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        cos.copy_(good_cos)
        needs_grad = q.clone().requires_grad_(True)
        got = modeling_qwen3.apply_rotary_pos_emb(needs_grad, k, cos, sin)
        assert torch.equal(got[0], host(needs_grad, k, cos, sin)[0]) and got[0].requires_grad
        got = modeling_qwen3.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin,
                                                  unsqueeze_dim=2)
        assert all(torch.equal(a, b) for a, b in zip(
            got, host(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2)))
        # An argument the op does not know, given a value: the host's function, counted.
        def with_ids(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            return host(q, k, cos, sin, unsqueeze_dim)
        seat = plan.swaps["model.rotary_emb"]
        assert seat.call(with_ids, (q, k, cos, sin), {"position_ids": torch.arange(3)}) is not None
        assert "position_ids" in seat.seat.ledger.last_reason
        assert rotary_rows(handle.report())[0]["fallbacks"] == fallbacks + 4
        # Another caller's tables are not claimed: its call is the host's, uncounted.
        calls = rotary_rows(handle.report())[0]["calls"]
        other = modeling_qwen3.apply_rotary_pos_emb(q, k, cos.clone(), sin.clone())
        assert all(torch.equal(a, b) for a, b in zip(other, host(q, k, cos, sin)))
        assert rotary_rows(handle.report())[0]["calls"] == calls
    finally:
        handle.detach()


def test_the_pairing_is_measured_not_read_from_the_name():
    assert measure_rotary(modeling_qwen3.apply_rotary_pos_emb)[0] == _core.RotaryForm.half
    from transformers.models.cohere import modeling_cohere
    form, _ = measure_rotary(modeling_cohere.apply_rotary_pos_emb)
    assert form == _core.RotaryForm.interleaved

    def scaled(q, k, cos, sin, unsqueeze_dim=1):  # a rotary of another form: not one the op takes
        return q * 2, k
    form, why = measure_rotary(scaled)
    assert form == _core.RotaryForm.other and "differs from both pairings" in why


def cohere() -> CohereForCausalLM:
    torch.manual_seed(6)
    cfg = CohereConfig(vocab_size=hosts.VOCAB, hidden_size=128, intermediate_size=256,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=256)
    return CohereForCausalLM(cfg).eval()


def phi3_partial() -> Phi3ForCausalLM:
    torch.manual_seed(7)
    cfg = Phi3Config(vocab_size=hosts.VOCAB, hidden_size=128, intermediate_size=256,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=256, partial_rotary_factor=0.5, pad_token_id=0)
    return Phi3ForCausalLM(cfg).eval()


@pytest.mark.parametrize(("build", "why"), [
    (cohere, "form 'interleaved' outside {half} (q 4 / k 2 heads of 32)"),
    (phi3_partial, "tables are 16 wide for heads of 32 (a partial rotary)"),
    (gated_delta_hosts.qwen35, "(a partial rotary)"),
])
def test_forms_the_op_does_not_compute_are_refused_by_form_and_shape(build, why):
    model = build()
    plan = plan_for(model)
    refused = [r for site, r in plan.notes["refused"] if "rotary_embed" in r]
    assert refused and why in refused[0], S.explain(plan)
    assert not [sp for sp in plan.seams if sp.seam.structure == "rotary_embed"]

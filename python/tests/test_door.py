"""The transformers door on real hosts: discovery, plans, explain, attach, the ledger, detach,
and the runtime contract (DESIGN §6) — positives and refusals."""

from __future__ import annotations

import copy
import logging
import threading

import pytest
import torch

import flashrt_structures as S
from flashrt_structures import ops
from flashrt_structures.observe import attention as attention_interface
from flashrt_structures.seats import SeatModule

import hosts


def decode_forward(model, n=1, seed=0):
    x = hosts.ids(n, seed)
    return lambda: model(x)


# The structures whose seats hold packed weights (a scheme's forms): the projection contract.
# The function structures (norms, attention, the gated delta rule) run at host precision.
FUNCTIONS = {"norm_fused", "attention_core", "attention_paged", "attention_sequence",
             "gated_delta_core", "causal_conv", "rotary_embed", "decoder_block"}
PROJECTIONS = [s for s in S.list_structures() if s not in FUNCTIONS]


def all_seats(model, scheme="w8a16_decode", n=4, **kw):
    return S.auto_swaps(model, decode_forward(model, n), scheme=scheme, min_seat_weights=0, **kw)


def counts(plan):
    out: dict[str, int] = {}
    for sp in plan.seams:
        out[sp.seam.structure] = out.get(sp.seam.structure, 0) + 1
    return out


def test_catalog_lists_the_shipped_structures():
    assert S.list_structures() == ["attention_core", "attention_paged", "attention_sequence",
                                   "causal_conv", "decoder_block", "decoder_ffn", "encoder_ffn",
                                   "gated_delta_core", "linear_proj", "lm_head",
                                   "modnorm_qkv_chain", "moe_experts", "norm_fused", "qkv_pack",
                                   "rotary_embed"]


@pytest.mark.parametrize("make,layers,norms", [(hosts.qwen3, 3, 4), (hosts.llama, 2, 2),
                                               (hosts.gemma, 2, 2)])
def test_discovery_counts_match_the_architecture(make, layers, norms):
    model = make(layers)
    plan = all_seats(model)
    # Per layer: four projections, the feed-forward, its attention and its norms (Qwen3's q/k
    # norms too), and the layer as one block over them; the final norm, the head and the model's
    # rotary.
    assert counts(plan) == {"linear_proj": 4 * layers, "decoder_ffn": layers, "lm_head": 1,
                            "attention_core": layers, "norm_fused": norms * layers + 1,
                            "rotary_embed": 1, "decoder_block": layers}
    assert plan.notes["refused"] == []
    sites = set(plan.swaps)
    for i in range(layers):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            assert f"model.layers.{i}.self_attn.{proj}" in sites
        assert f"model.layers.{i}.mlp" in sites
    assert "lm_head" in sites


def test_gemma_head_is_found_tied_and_its_gelu_tanh_ffn_seated():
    plan = all_seats(hosts.gemma())
    ffn = [sp for sp in plan.seams if sp.seam.structure == "decoder_ffn"]
    assert {sp.seam.activation for sp in ffn} == {S._core.Activation.gelu_tanh}
    head = next(sp for sp in plan.seams if sp.seam.structure == "lm_head")
    assert head.seam.tied
    assert any("tied" in a for a in plan.notes["assumed"])


@pytest.mark.real_model
def test_minilm_projections_are_linear_proj_and_its_ungated_ffn_is_not_a_decoder_ffn():
    model, tok = hosts.minilm()
    batch = tok(["flashrt seats what it can prove"], return_tensors="pt")
    plan = S.auto_swaps(model, lambda: model(**batch), scheme="w8a16_decode")
    # 6 layers x (query, key, value, attention.output.dense, intermediate.dense, output.dense)
    # + pooler.dense; no gate/up/down triple, no head.
    # Its six attention modules call the attention interface: seated (for one-token calls; an
    # encoder's calls are prompts, band dispatches).
    assert counts(plan) == {"linear_proj": 37, "attention_core": 6}
    assert not any("decoder_ffn" in r for _, r in plan.notes["refused"])


def test_a_host_no_structure_describes_yields_nothing_quietly():
    # GPT-2 projections are Conv1D modules, not linears, and its MLP is not gated: only the
    # (tied, linear) head is a seam.
    # Its attention calls the attention interface (seated); its norms are layer norms, refused
    # by form (what they compute beside the rms forms: a layer norm measures as other).
    # Its layers compose norms, attention and MLP as a pre-norm block does, but the attention's
    # projection is one Conv1D: the block is refused naming that.
    plan = all_seats(hosts.gpt2())
    assert counts(plan) == {"lm_head": 1, "attention_core": 2}
    refused = dict(plan.notes["refused"])
    blocks = {site: why for site, why in refused.items() if "decoder_block" in why}
    assert set(blocks) == {"transformer.h.0", "transformer.h.1"}
    assert all("0 projections of transformer.h." in why and "the form has q, k and v" in why
               for why in blocks.values()), blocks
    assert all("norm_fused: form 'other' outside {rms, rms_one_plus}" in why
               for site, why in refused.items() if site not in blocks), refused


def test_biased_gated_mlp_is_refused_by_name_and_its_projections_stay_linear():
    plan = all_seats(hosts.llama(mlp_bias=True))
    refused = dict(plan.notes["refused"])
    assert "decoder_ffn: biased projections" in refused["model.layers.0.mlp"]
    assert "[640x256]" in refused["model.layers.0.mlp"]
    assert counts(plan)["linear_proj"] == 2 * (4 + 3)


def test_activation_outside_the_boundary_is_refused_with_the_form():
    plan = all_seats(hosts.llama(hidden_act="relu"))
    refused = dict(plan.notes["refused"])
    assert "activation 'relu' outside {silu, gelu_tanh}" in refused["model.layers.1.mlp"]


def test_explain_prints_every_seat_keep_and_refusal_with_counts():
    model = hosts.qwen3()
    plan = S.auto_swaps(model, decode_forward(model), scheme="w4a16_decode")
    text = S.explain(plan)
    assert text.startswith("flashrt plan: scheme w4a16_decode, 25 seams found")
    assert "kept at host:" in text and "below the 65536" in text
    # The default w4 scheme: the offset int4 grid, the head at Q8_0-class int8.
    assert "int4 g32 asymmetric f16 scales" in text and "int8 g32 f16 scales" in text


def test_scheme_none_keeps_everything_at_host_and_outputs_are_the_hosts():
    model = hosts.qwen3()
    x = hosts.ids(6)
    with torch.no_grad():
        want = model(x).logits
    plan = S.auto_swaps(model, lambda: model(x), scheme="none")
    assert plan.swaps == {} and len(plan.notes["scheme"]["keep_host"]) == 25
    with pytest.raises(ValueError, match="no swaps"):
        plan.attach(model)
    with torch.no_grad():
        assert torch.equal(model(x).logits, want)


def test_modules_the_observed_forward_never_called_are_refused_not_guessed():
    model, other = hosts.qwen3(1), hosts.qwen3(1)
    plan = S.auto_swaps(model, decode_forward(other), scheme="w8a16_decode")
    assert plan.swaps == {} or set(plan.swaps) == {"lm_head"}
    assert any("never called in the observed forward" in r for _, r in plan.notes["refused"])


def test_unknown_scheme_and_structure_are_errors():
    model = hosts.qwen3(1)
    with pytest.raises(ValueError, match="unknown scheme 'w3'"):
        S.auto_swaps(model, decode_forward(model), scheme="w3")
    with pytest.raises(ValueError, match="unknown structure 'conv'"):
        S.auto_swaps(model, decode_forward(model), structures=["conv"])


def test_attach_detach_is_bit_exact_and_keeps_the_hosts_objects():
    model = hosts.qwen3()
    x = hosts.ids(1)
    params = {n: p for n, p in model.named_parameters()}
    before = {n: p.detach().clone() for n, p in params.items()}
    sd_host = model.state_dict()
    with torch.no_grad():
        want = model(x).logits
    handle = all_seats(model).attach(model)
    assert S.attached(model)
    sd_seated = model.state_dict()
    assert list(sd_seated) == list(sd_host)
    assert all(torch.equal(sd_seated[k], sd_host[k]) for k in sd_host)
    with torch.no_grad():
        got = model(x).logits
    assert not torch.equal(got, want)  # int8 weights: close, not equal
    assert handle.summary()["seams"] == 25 and handle.summary()["clean"]
    # Its attention is routed where the host's call resolves: the configuration keeps its name.
    sdpa = attention_interface._interfaces()._global_mapping["sdpa"]
    assert hasattr(sdpa, "_flashrt_original") and model.config._attn_implementation == "sdpa"
    handle.detach()
    handle.detach()  # idempotent
    assert not hasattr(attention_interface._interfaces()._global_mapping["sdpa"],
                       "_flashrt_original")
    assert not S.attached(model)
    with torch.no_grad():
        assert torch.equal(model(x).logits, want)
    for n, p in model.named_parameters():
        assert p is params[n] and torch.equal(p.detach(), before[n])
    assert not any(isinstance(m, SeatModule) for m in model.modules())


def test_prefill_rows_outside_the_band_run_the_host_counted_as_band_dispatches():
    model = hosts.qwen3()
    x = hosts.ids(24)  # 24 rows > 16
    with torch.no_grad():
        want = model(x).logits
    # (Norm seats serve every row count: left out, so the prompt is the host's bit for bit.)
    handle = all_seats(model, structures=PROJECTIONS + ["attention_core"]).attach(model)
    with torch.no_grad():
        got = model(x).logits
    s = handle.summary()
    # every seat but the head saw 24 rows; the head too (all positions' logits); each attention
    # a 24-token prompt
    assert s["band_dispatches"] == 11 + 2 and s["fallbacks"] == 0
    assert torch.equal(got, want)
    handle.detach()


def test_training_mode_is_refused_at_attach():
    model = hosts.qwen3(1)
    plan = all_seats(model)
    model.train()
    with pytest.raises(ValueError, match="training mode"):
        plan.attach(model)
    assert not any(isinstance(m, SeatModule) for m in model.modules())


def test_migration_and_load_state_dict_are_refused_while_attached():
    model = hosts.qwen3(1)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    handle = all_seats(model).attach(model)
    with pytest.raises(RuntimeError, match="migration refused while attached"):
        model.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="load_state_dict refused while attached"):
        model.load_state_dict(sd)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    handle.detach()
    model.load_state_dict(sd)  # fine again after detach


def test_a_second_thread_falls_back_and_is_counted():
    model = hosts.qwen3(1)
    x = hosts.ids(1)
    handle = all_seats(model).attach(model)
    with torch.no_grad():
        mine = model(x).logits
    theirs = {}

    def other():
        with torch.no_grad():
            theirs["logits"] = model(x).logits

    t = threading.Thread(target=other)
    with pytest.warns(RuntimeWarning, match="second thread"):
        t.start()
        t.join()
    rep = {r["site"]: r for r in handle.report()}
    assert rep["lm_head"]["fallbacks"] == 1
    assert rep["lm_head"]["last_reason"] == "called from a second thread"
    # q, k, v, o, mlp, head, the attention, four norms and the final one, the rotary, the layer
    assert handle.summary()["fallbacks"] == handle.summary()["seams"] == 14
    assert theirs["logits"].shape == mine.shape
    handle.detach()


def test_thirty_two_consecutive_fallbacks_put_the_host_back():
    model = hosts.qwen3(1)
    x = hosts.ids(1)
    head = model.lm_head
    plan = all_seats(model)
    handle = plan.attach(model)
    model.train()  # every seated call now falls back ("training mode")
    with pytest.warns(RuntimeWarning):
        with torch.no_grad():
            for _ in range(32):
                model(x)
    assert model.lm_head is head
    assert handle.summary()["restored"] == 14  # the layer's block too
    model.eval()
    with torch.no_grad():
        model(x)
    assert handle.report()[0]["calls"] == 32  # restored seats see no more calls
    handle.detach()
    assert model.lm_head is head
    # For good: the same seats are not attached again.
    with pytest.raises(ValueError, match="gave its region back to the host after 32 consecutive"):
        plan.attach(model)
    assert model.lm_head is head and not S.attached(model)


def test_on_guard_fail_raise_raises_instead_of_falling_back():
    model = hosts.qwen3(1)
    handle = all_seats(model).attach(model, on_guard_fail="raise")
    x = hosts.ids(1)
    with torch.no_grad():
        model(x)  # in form: fine
    with pytest.raises(S.GuardRefused, match="input requires grad"):
        model(x)  # grad enabled, and the embedding output requires grad
    assert handle.summary()["fallbacks"] == 0
    assert all(r.seat.seat.mode == S._core.GuardMode.raise_ for r in handle.records)
    handle.detach()


def test_an_unknown_guard_mode_is_refused_before_anything_is_seated():
    model = hosts.qwen3(1)
    head = model.lm_head
    with pytest.raises(ValueError, match="on_guard_fail 'ignore' not in {'fallback', 'raise'}"):
        all_seats(model).attach(model, on_guard_fail="ignore")
    assert model.lm_head is head and not S.attached(model)


def test_nan_inputs_do_not_crash():
    model = hosts.qwen3(1)
    handle = all_seats(model).attach(model)
    emb = model.get_input_embeddings()(hosts.ids(1)).detach()
    emb[0, 0, 3] = float("nan")
    with torch.no_grad():
        out = model(inputs_embeds=emb).logits
    assert torch.isnan(out).any()
    assert handle.summary()["fallbacks"] == 0
    handle.detach()


def test_every_door_logs_one_line(caplog):
    model = hosts.qwen3(1)
    with caplog.at_level(logging.WARNING, logger="flashrt"):
        handle = all_seats(model).attach(model)
    assert "[flashrt] 14 seats, 0 refused" in caplog.text
    handle.detach()


@pytest.mark.real_model
def test_w8_parity_on_the_real_minilm_checkpoint():
    model, tok = hosts.minilm()
    batch = tok(["a decode-sized sentence of text"], return_tensors="pt")
    with torch.no_grad():
        want = model(**batch).last_hidden_state.mean(1)
    handle = S.auto_swaps(model, lambda: model(**batch), scheme="w8a16_decode").attach(model)
    with torch.no_grad():
        got = model(**batch).last_hidden_state.mean(1)
    s = handle.summary()
    handle.detach()
    assert s["seams"] == 37 + 6 and s["fallbacks"] == 0 and s["band_dispatches"] == 6
    cos = torch.nn.functional.cosine_similarity(got, want).item()
    assert cos >= 0.999, cos


# Random-weight logits are nearly flat, so top-1 flips on tiny differences; the band is reported
# (and asserted to be computed), the last position's logit cosine is the stable figure.
@pytest.mark.parametrize("scheme,floor", [("w8a16_decode", 0.999), ("w4a16_decode", 0.98),
                                          ("w8a8_decode", 0.999), ("w4a8_decode", 0.98),
                                          ("w4a8_asym_decode", 0.98)])
def test_qwen3_logit_parity_band_is_reported(scheme, floor):
    model = hosts.qwen3()
    x = hosts.ids(12)
    with torch.no_grad():
        want = model(x).logits
    handle = S.auto_swaps(model, lambda: model(x), scheme=scheme).attach(model)
    with torch.no_grad():
        got = model(x).logits
    handle.detach()
    kind = S._core.OutputKind.distribution
    p = S.frontdoor.parity(got, want, kind)
    bands = S.catalog.shipped().band(kind)
    assert p["band"] == S._core.band_name(S._core.parity_band(bands, p["top1_agreement"]))
    assert 0 < p["top1_agreement"] <= 1
    assert p["last_position_cosine"] >= floor, p


@pytest.mark.parametrize("make", [hosts.llama, hosts.gemma])
def test_w8a8_decode_seats_every_projection_on_the_integer_gemm_at_decode_rows(make):
    """w8a8_decode: int8 activations per row, integer dot products (flashrt/gemm) at the decode
    band; the fused ffn op takes no such layout, so the FFN is seated projection by projection;
    rows above the band (prefill) run the host, counted, and are bit-identical to it."""
    model = make()
    plan = all_seats(model, scheme="w8a8_decode", structures=PROJECTIONS)
    assert plan.seams and all(sp.package == "flashrt/gemm" for sp in plan.seams)
    assert all(sp.form.tag == "w8a8" and (sp.band_min, sp.band_max) == (1, 16)
               for sp in plan.seams)
    assert {sp.impl for sp in plan.seams} == {"gemm_w8a8", "gemm_as_projections_w8a8"}
    assert any(sp.seam.structure == "lm_head" for sp in plan.seams)
    x, prefill = hosts.ids(6, seed=3), hosts.ids(24, seed=3)
    with torch.no_grad():
        want, want_prefill = model(x).logits, model(prefill).logits
    handle = plan.attach(model)
    with torch.no_grad():
        got = model(x).logits
        calls = handle.summary()["guarded_calls"]
        got_prefill = model(prefill).logits
    s = handle.summary()
    handle.detach()
    assert s["fallbacks"] == 0 and s["band_dispatches"] == len(plan.seams)
    assert calls == len(plan.seams) and s["guarded_calls"] == 2 * len(plan.seams)
    assert torch.equal(got_prefill, want_prefill)
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    assert cos >= 0.999, cos


@pytest.mark.slow
@pytest.mark.parametrize("make", [hosts.llama, hosts.gemma, hosts.qwen3])
@pytest.mark.parametrize("scheme,tag,describe", [
    ("w4a8_decode", "w4a8", "int4 g32 symmetric f16 scales, activations int8 per 32"),
    ("w4a8_asym_decode", "w4g32a8", "int4 g32 asymmetric f16 scales, activations int8 per 32")])
def test_w4a8_decode_seats_int4_projections_and_an_int8_head_on_the_integer_gemm(
        make, scheme, tag, describe):
    """w4a8: int4 g32 nibbles against int8 activation blocks (Note [W4A8]) for every projection,
    the head at int8 in the same GEMM; decode rows run the seats, prefill runs the host."""
    model = make()
    plan = all_seats(model, scheme=scheme, structures=PROJECTIONS)
    assert plan.seams and all(sp.package == "flashrt/gemm" for sp in plan.seams)
    head = [sp for sp in plan.seams if sp.seam.structure == "lm_head"]
    body = [sp for sp in plan.seams if sp.seam.structure != "lm_head"]
    assert len(head) == 1 and head[0].form.tag == "w8a8"
    assert body and all(sp.form.tag == tag and sp.form.describe() == describe for sp in body)
    assert all((sp.band_min, sp.band_max) == (1, 16) for sp in plan.seams)
    x, prefill = hosts.ids(6, seed=3), hosts.ids(24, seed=3)
    # The host with the packs' own weights in fp: what the seats compute, up to the activations.
    weights_only = copy.deepcopy(model)
    for name, mod in weights_only.named_modules():
        if isinstance(mod, torch.nn.Linear):
            w = mod.weight.detach()
            pack = ops.pack_int8_gemm(w, 32) if name.endswith("lm_head") else \
                ops.pack_int4_gemm(w, symmetric=scheme == "w4a8_decode")
            mod.weight = torch.nn.Parameter(torch.as_tensor(pack.dequantize()).reshape(w.shape))
    with torch.no_grad():
        want, want_prefill = model(x).logits, model(prefill).logits
        want_w = weights_only(x).logits
    handle = plan.attach(model)
    with torch.no_grad():
        got = model(x).logits
        got_prefill = model(prefill).logits
    s = handle.summary()
    handle.detach()
    assert s["fallbacks"] == 0 and s["band_dispatches"] == len(plan.seams)
    assert torch.equal(got_prefill, want_prefill)
    cosine = torch.nn.functional.cosine_similarity
    cos_w = cosine(got.flatten(), want_w.flatten(), dim=0).item()
    assert cos_w >= 0.999, cos_w  # the activation blocks cost no more than in w8a8
    assert cosine(got.flatten(), want.flatten(), dim=0).item() >= 0.95  # int4 weights' own cost
    with torch.no_grad():
        assert torch.equal(model(x).logits, want)  # detached bit-exactly


@pytest.mark.parametrize("scheme,decode_twin", [("w8a8_all", "w8a8_decode"),
                                                ("w4a8_all", "w4a8_decode")])
def test_all_rows_schemes_seat_prefill_too_and_a_row_computes_as_it_would_alone(scheme,
                                                                                decode_twin):
    """The *_all schemes seat the decode forms at every row count: a 24-row prefill runs the
    seats (no band dispatch), and since activation blocks are per row, each row of a chunk gets
    the bits it gets alone, so prefill and decode agree with the decode-band scheme's rows."""
    model = hosts.qwen3()
    x = hosts.ids(24, seed=3)
    plan = all_seats(model, scheme=scheme, structures=PROJECTIONS)
    assert all((sp.band_min, sp.band_max) == (1, 2**62) for sp in plan.seams)
    handle = plan.attach(model)
    with torch.no_grad():
        got = model(x).logits
    s = handle.summary()
    handle.detach()
    assert s["band_dispatches"] == 0 and s["fallbacks"] == 0
    assert s["guarded_calls"] == len(plan.seams)
    twin = all_seats(model, scheme=decode_twin, structures=PROJECTIONS)
    assert [sp.form.describe() for sp in twin.seams] == [sp.form.describe() for sp in plan.seams]
    w = model.model.layers[0].mlp.down_proj.weight.detach()
    pack = ops.pack_int8_gemm(w, 32) if scheme == "w8a8_all" else ops.pack_int4_gemm(w)
    rows = torch.randn(40, w.shape[1])
    chunk = ops.linear(rows, pack)
    alone = torch.cat([ops.linear(rows[i:i + 1], pack) for i in range(rows.shape[0])])
    assert torch.equal(chunk, alone)
    with torch.no_grad():
        want = model(x).logits
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    assert cos >= (0.999 if scheme == "w8a8_all" else 0.95), cos


def test_w4a8_steps_aside_to_int8_where_the_group_does_not_divide_the_width():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=hosts.VOCAB, hidden_size=256, intermediate_size=720,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4)
    model = LlamaForCausalLM(cfg).eval()  # down_proj reads 720 = 22.5 groups of 32
    plan = all_seats(model, scheme="w4a8_decode")
    forms = {sp.seam.structure: sp.form.describe() for sp in plan.seams}
    assert forms["decoder_ffn"] == "int8 per-channel, activations int8 per 32"
    assert forms["linear_proj"] == "int4 g32 symmetric f16 scales, activations int8 per 32"
    assert "needs widths divisible by 32" in S.explain(plan)


def test_gated_attach_reports_units_and_refuses_the_whole_host_when_nothing_passes():
    model = hosts.qwen3()
    x = hosts.ids(1)
    with torch.no_grad():
        want = model(x).logits
    originals = dict(model.named_modules())
    result = S.attach(model, lambda: model(x), floors={"top1_agreement": 1.01}, rounds=2)
    assert not result.active and not S.attached(model)
    assert set(result.units) == {"linear_proj", "decoder_ffn", "lm_head", "norm_fused",
                                 "attention_core", "rotary_embed"}
    # auto measured every candidate scheme; each was refused by the floor
    for u in result.units.values():
        assert u["decision"].startswith("refused: no candidate passed")
        assert u["candidates"] and all(c["decision"].startswith("refused: top1_agreement")
                                       for c in u["candidates"].values())
    assert dict(model.named_modules()).keys() == originals.keys()
    assert all(m is originals[n] for n, m in model.named_modules())
    with torch.no_grad():
        assert torch.equal(model(x).logits, want)


def test_gated_auto_keeps_per_unit_the_fastest_candidate_that_passes():
    """Note [Gated auto]: every gated_auto scheme is measured per unit; the kept one is the
    fastest whose verdict is activated and whose parity is in the pass band, whatever this
    machine's speeds make that; a unit without such a candidate stays with the host."""
    model = hosts.qwen3()
    x = hosts.ids(1)
    with torch.no_grad():
        want = model(x).logits
    result = S.attach(model, lambda: model(x), rounds=3, min_speedup=1.0)
    try:
        listed = set(S.catalog.shipped().schemes.gated_auto)
        chosen = result.notes["scheme"].get("chosen", {})
        for unit, u in result.units.items():
            if unit == "union":
                continue
            assert set(u["candidates"]) <= listed and len(u["candidates"]) >= 2
            passing = {n: c["speedup"] for n, c in u["candidates"].items()
                       if c["decision"] == "activated" and c["parity"]["band"] == "pass"}
            if passing:
                assert chosen[unit] == max(passing, key=passing.get) == u["scheme"]
            else:
                assert unit not in chosen and u["decision"].startswith("refused: no candidate")
        if result.active:
            assert any(isinstance(m, SeatModule) for m in model.modules())
            assert result.summary()["clean"]
    finally:
        result.detach()
    with torch.no_grad():
        assert torch.equal(model(x).logits, want)


def test_a_candidate_that_cannot_be_measured_is_refused_and_the_others_still_compete(
        monkeypatch):
    """A seat that gives its region back mid-measurement (swap.attach then raises) refuses that
    candidate only: attach neither raises nor leaves the host modified."""
    from flashrt_structures import frontdoor

    model = hosts.qwen3(1)
    x = hosts.ids(1)
    with torch.no_grad():
        want = model(x).logits
    real_attach = frontdoor.swap.attach
    seen: set[int] = set()

    def flaky(m, swaps, **kw):
        if any("w8a8 gemm" in s.seat.form.describe() for s in swaps.values()):
            if id(swaps) in seen:  # each w8a8 unit's second attach
                raise ValueError("flashrt: the seat for x gave its region back to the host")
            seen.add(id(swaps))
        return real_attach(m, swaps, **kw)

    monkeypatch.setattr(frontdoor.swap, "attach", flaky)
    result = S.attach(model, lambda: model(x), rounds=2, min_speedup=0.0)
    try:
        # (A function unit's seats are the same under every scheme: none holds a w8a8 form.)
        units = {n: u for n, u in result.units.items() if n != "union" and n not in FUNCTIONS}
        w8a8 = [u["candidates"]["w8a8_decode"] for u in units.values()]
        assert w8a8 and all(c["decision"].startswith("refused: flashrt: the seat") for c in w8a8)
        assert all(u["scheme"] != "w8a8_decode" for u in units.values())
    finally:
        result.detach()
    assert not any(isinstance(m, SeatModule) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(x).logits, want)


def test_gated_attach_of_a_named_scheme_measures_that_scheme_alone():
    model = hosts.qwen3(1)
    x = hosts.ids(1)
    result = S.attach(model, lambda: model(x), scheme="w8a16_decode", rounds=1,
                      min_speedup=0.0)
    try:
        assert result.units and all("candidates" not in u for u in result.units.values())
        assert all(u["scheme"] == "w8a16_decode" for n, u in result.units.items() if n != "union")
    finally:
        result.detach()


def test_gated_attach_with_a_floor_on_an_unmeasured_metric_is_an_error():
    model = hosts.qwen3(1)
    x = hosts.ids(1)
    with pytest.raises(ValueError, match="does not measure"):
        S.attach(model, lambda: model(x), floors={"cosine": 0.99}, rounds=1)
    assert not any(isinstance(m, SeatModule) for m in model.modules())


def test_get_bind_seats_one_chosen_module_and_certifies_it():
    model = hosts.qwen3(1)
    mlp = model.model.layers[0].mlp
    xs = [torch.randn(1, 256) for _ in range(3)]
    bound = S.get("decoder_ffn").bind(mlp, calibration=xs)
    assert bound.certification["worst_cos"] >= 0.999
    assert bound.certification["structure"] == "decoder_ffn"
    lin = S.get("linear_proj").bind(model.model.layers[0].self_attn.q_proj, calibration=xs)
    assert lin.certification["samples"] == 3
    with pytest.raises(S.GateRefused, match="worst cosine"):
        S.get("decoder_ffn").bind(mlp, calibration=xs, scheme="w4a16_decode", gate_cos=1.0)


@pytest.mark.real_model
def test_get_bind_refuses_a_module_the_structure_does_not_describe():
    model, _ = hosts.minilm()
    intermediate = model.encoder.layer[0].intermediate  # dense + GELU: not gated
    with pytest.raises(ValueError, match="not bound as decoder_ffn"):
        S.get("decoder_ffn").bind(intermediate, calibration=[torch.randn(1, 384)])
    with pytest.raises(KeyError, match="unknown structure"):
        S.get("conv2d")


@pytest.mark.slow
def test_with_every_kernel_package_unavailable_everything_is_refused_and_outputs_are_the_hosts(
        tmp_path):
    # A fresh interpreter whose kernel path holds only broken packages: every seam is refused
    # with the package named, nothing is swapped, and the host's output is untouched.
    import json
    import os
    import subprocess
    import sys

    for repo in ("flashrt/linear", "flashrt/ffn"):
        (tmp_path / repo).mkdir(parents=True)
        (tmp_path / repo / "metadata.json").write_text("{ not json")
    code = (
        "import sys, json, torch\n"
        f"sys.path.insert(0, {str(os.path.dirname(__file__))!r})\n"
        "import hosts, flashrt_structures as S\n"
        "m = hosts.qwen3(1); x = hosts.ids(3)\n"
        "with torch.no_grad(): want = m(x).logits\n"
        "plan = S.auto_swaps(m, lambda: m(x), scheme='w8a16_decode', min_seat_weights=0)\n"
        "with torch.no_grad(): same = torch.equal(m(x).logits, want)\n"
        "print(json.dumps({'swaps': len(plan.swaps), 'refused': plan.notes['refused'],\n"
        "  'unavailable': plan.notes['kernel_unavailable'], 'same': same}))\n"
    )
    env = dict(os.environ, FLASHRT_KERNEL_PATH=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # The norms, the attention and the rotary are flashrt/decode's: seated (four norms, the
    # final, the attention, the rotary); the host's outputs unchanged by planning.
    assert out["swaps"] == 7 and out["same"]
    assert len(out["refused"]) == 6  # q, k, v, o, the FFN, the head
    assert all("kernel package flashrt/linear unavailable" in r for _, r in out["refused"])
    assert {e["repo"] for e in out["unavailable"]} == {"flashrt/linear", "flashrt/ffn"}
    assert all(e["error"] == "corrupt metadata" for e in out["unavailable"])


def test_every_seat_reports_the_packed_bytes_it_streams():
    model = hosts.qwen3(1)
    plan = all_seats(model, scheme="w8a16_channel_decode")
    ffn = plan.swaps["model.layers.0.mlp"].seat
    # gate and up: 768 x 256 int8 + 768 scales; down: 256 x 768 int8 + 256 scales (fp32)
    assert ffn.nbytes == 2 * (768 * 256 + 768 * 4) + (256 * 768 + 256 * 4)
    assert plan.swaps["lm_head"].seat.nbytes == hosts.VOCAB * 256 + hosts.VOCAB * 4
    # the default w8 scheme: a half-precision scale per 64 inputs
    grouped = all_seats(model).swaps
    assert grouped["model.layers.0.mlp"].seat.nbytes == (
        2 * (768 * 256 + 768 * 256 // 64 * 2) + (256 * 768 + 256 * 768 // 64 * 2))
    assert grouped["lm_head"].seat.nbytes == hosts.VOCAB * 256 + hosts.VOCAB * 256 // 64 * 2


def test_a_seat_reads_leading_dims_as_rows_only_where_they_are_rows_apart():
    """The core reads a tensor's leading dims as rows where they step by whole rows: a batch of
    sequences is one matrix, an expanded (stride 0) or padded layout is never read as one."""
    model = hosts.qwen3(1)
    plan = all_seats(model, structures=["linear_proj"])
    site = "model.layers.0.self_attn.q_proj"
    seat, host = plan.swaps[site], model.get_submodule(site)
    handle = plan.attach(model)
    try:
        width = host.in_features
        x = torch.randn(2, 3, width)
        with torch.no_grad():
            got, want = seat(x), host(x)
        assert got.shape == want.shape and ops_close(got, want)
        fallbacks = seat.seat.ledger.fallbacks
        for bad in (torch.randn(1, 1, width).expand(1, 4, width),  # one row read four times
                    torch.randn(3, 2, width).transpose(0, 1)):  # rows not one stride apart
            out = torch.empty(*bad.shape[:-1], host.out_features)
            assert seat.seat.run(bad, out, False) != S.seats.RAN
        assert seat.seat.ledger.fallbacks == fallbacks + 2
    finally:
        handle.detach()


def ops_close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item() > 0.999

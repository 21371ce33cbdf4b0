"""decode_loop beyond Llama (issue 28): Gemma 2 and 3, Phi-3 / Phi-4-mini, OLMo 2, Granite and
SmolLM3 from their config classes, each bound by the binding that describes its structure and
computing each family's forms (sliding windows past the window, softcaps, multipliers,
rotary-free layers, partial rotary, fused projections, post-norms); and the hosts no binding
describes, refused with what each binding found."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import flashrt_structures as S

import decoder_hosts
import hosts

warnings.filterwarnings("ignore", category=FutureWarning)
FAMILIES = sorted(decoder_hosts.FAMILIES)


def _same_tokens(model, loop, ids: torch.Tensor, new: int) -> None:
    want = hosts.generate(model, ids, new)
    got = loop.generate(ids, new)
    assert got.shape == want.shape
    div = hosts.first_divergence(model, got, want, ids.shape[1])
    if div is not None:  # allowed only inside the rounding of two summation orders
        step, margin = div
        assert margin < 1e-4, f"diverged at step {step} with host top-2 margin {margin}"


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_the_hosts_generate_past_the_window(family):
    model = decoder_hosts.FAMILIES[family]()
    snap = hosts.snapshot(model)
    loop = S.decode_loop(model, max_len=64)
    assert loop.plan.binding == decoder_hosts.BINDINGS[family]
    assert loop.self_check["min_cosine"] > 0.99999, loop.self_check
    for seed, length in enumerate((3, 9, 16)):  # 16 + 32 runs well past the window of 8
        _same_tokens(model, loop, hosts.ids(length, seed=seed), 32)
    # generate_from imports the host's cache (a sliding layer's holds its window only).
    ids = hosts.ids(12, seed=7)
    assert torch.equal(loop.generate_from(ids, 12), loop.generate(ids, 12))
    assert hosts.same_weights(model, snap)  # borrowed, never written


@pytest.mark.parametrize("family", FAMILIES)
def test_seated_w8_first_logits_stay_within_the_values_band(family):
    model = decoder_hosts.FAMILIES[family]()
    ids = hosts.ids(8, seed=11)
    with torch.no_grad():
        want = model(ids).logits[0, -1]
    handle = S.auto_swaps(model, lambda: model(ids[:, :1]), scheme="w8a16_decode",
                          min_seat_weights=0).attach(model)
    try:
        loop = S.decode_loop(model, max_len=32)
        assert loop.seated > 0, S.explain(loop)
        loop.program.prefill(ids[0].tolist(), 0)
        got = torch.from_numpy(loop.program.logits())
    finally:
        handle.detach()
    cosine = float(torch.nn.functional.cosine_similarity(got.double(), want.double(), dim=0))
    print(f"{family} w8a16: first-step logits cosine {cosine:.6f}, {loop.seated} seated")
    assert cosine >= 0.999


def test_gemma_sliding_layers_attend_to_their_window_only():
    model = decoder_hosts.gemma2()
    plan = S.decode.plan_decode(model, 64)
    assert plan.ok, S.explain(plan)
    windows = [lc.window for lc in plan.config.layer]
    assert windows == [decoder_hosts.WINDOW, 0, decoder_hosts.WINDOW]
    c = plan.config
    assert c.norm_plus_one and c.attention_softcap == 50.0 and c.final_softcap == 30.0
    assert c.embed_scale == pytest.approx(16.0)  # sqrt(256), measured on the embedding's call
    assert c.attention_scale == pytest.approx(256 ** -0.5)  # query_pre_attn_scalar 256
    gemma3 = S.decode.plan_decode(decoder_hosts.gemma3(), 64).config
    assert len(gemma3.rotaries) == 2  # local and global bases, one table each
    assert [lc.rotary for lc in gemma3.layer][:2] != [gemma3.layer[2].rotary] * 2
    assert gemma3.attention_scale == pytest.approx(48 ** -0.5)
    assert all(lc.qk_norm == S._core.QkNorm.per_head for lc in gemma3.layer)


def test_each_family_s_forms_are_read_into_the_plan():
    phi4 = S.decode.plan_decode(decoder_hosts.phi4_mini(), 64)
    assert phi4.config.rotary_dim == 48 and phi4.config.head_dim == 64
    assert phi4.layers[0].slots["qkv"] == "model.layers.0.self_attn.qkv_proj"
    olmo = S.decode.plan_decode(decoder_hosts.olmo2(), 64)
    assert all(lc.qk_norm == S._core.QkNorm.whole for lc in olmo.config.layer)
    assert "attn_in_norm" not in olmo.layers[0].slots
    smol = S.decode.plan_decode(decoder_hosts.smollm3(), 64)
    assert [lc.rotary for lc in smol.config.layer] == [0, -1, 0]
    granite = S.decode.plan_decode(decoder_hosts.granite(), 64).config
    assert (granite.embed_scale, granite.residual_scale, granite.logits_divisor) == (
        12.0, pytest.approx(0.22), 8.0)
    assert granite.attention_scale == 0.015625


def test_explain_names_the_binding_and_every_primitive():
    text = S.explain(S.decode.plan_decode(decoder_hosts.gemma2(), 64))
    assert text.startswith("flashrt decode plan: binding gemma_decode, 3 layers"), text
    for part in ("norms x·(1+w)/rms(x) before and after attention, before and after the "
                 "feed-forward", "full on layers 1", "a sliding window of 8 on layers 0, 2",
                 "scores softcapped at 50", "embedding x16", "logits softcapped at 30",
                 "attn_logit_softcapping 50: as the configuration declares it"):
        assert part in text, text
    phi = S.explain(S.decode.plan_decode(decoder_hosts.phi4_mini(), 64))
    assert "q/k/v one fused projection; gate/up one fused projection" in phi
    assert "over 48 of 64 dims" in phi and "partial rotary: the leading 48" in phi
    olmo = S.explain(S.decode.plan_decode(decoder_hosts.olmo2(), 64))
    assert "after attention, after the feed-forward" in olmo
    assert "q/k norms over the whole projection" in olmo
    assert "none on layers 1" in S.explain(S.decode.plan_decode(decoder_hosts.smollm3(), 64))


def test_a_host_no_binding_describes_is_told_what_each_found():
    model = hosts.gpt2()
    plan = S.decode.plan_decode(model, 32)
    assert not plan.ok and not plan.fits and plan.binding == ""
    why = plan.refused[0][1]
    assert why.startswith("no decode binding describes this host (")
    for binding in ("gemma_decode", "llama_decode", "olmo2_decode", "phi3_decode"):
        assert f"{binding}: a required slot is absent on this host" in why
    with pytest.raises(S.Refused, match="no decode binding describes this host"):
        S.decode_loop(model, max_len=32)


def test_a_weight_outside_every_slot_means_no_binding_fits():
    """A Llama layer holding one more projection: the program would leave it out, so Llama's
    binding does not describe the host (Note [Every weight is a slot])."""
    model = hosts.llama(2)
    model.model.layers[1].self_attn.extra_proj = nn.Linear(256, 256, bias=False)
    snap = hosts.snapshot(model)
    plan = S.decode.plan_decode(model, 32)
    assert not plan.ok and not plan.fits
    assert ("llama_decode: model.layers.1.self_attn.extra_proj (Linear) holds a weight and is no "
            "slot the loop computes") in plan.refused[0][1]
    with pytest.raises(S.Refused, match="extra_proj"):
        S.decode_loop(model, max_len=32)
    assert hosts.same_weights(model, snap)


def test_a_layer_type_the_loop_does_not_compute_is_refused_by_name():
    model = decoder_hosts.gemma3()
    model.config.layer_types = ["sliding_attention", "chunked_attention", "full_attention"]
    plan = S.decode.plan_decode(model, 32)
    assert plan.fits and not plan.ok
    assert plan.refused[0] == (
        "model.layers.1", "model.layers.1 is a 'chunked_attention' layer; the loop computes full "
        "and sliding-window attention")


def test_an_embedding_that_is_not_its_rows_times_a_constant_is_refused():
    model = decoder_hosts.gemma2()
    embed = model.model.embed_tokens
    embed.embed_scale = torch.linspace(1.0, 2.0, 256)  # a scale per feature, not one constant
    with pytest.raises(S.Refused, match="does not return its rows times one constant"):
        S.decode_loop(model, max_len=32)


def test_a_norm_form_no_binding_takes_is_refused_by_its_measured_form():
    from transformers import StableLmConfig, StableLmForCausalLM

    torch.manual_seed(26)
    model = StableLmForCausalLM(StableLmConfig(
        vocab_size=hosts.VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2)).eval()
    plan = S.decode.plan_decode(model, 32)
    assert plan.fits and plan.binding == "llama_decode"  # Llama's slots, LayerNorm's form
    site, why = plan.refused[0]
    assert site == "model.layers.0.input_layernorm"
    assert "computes the norm form 'other' (measured); binding llama_decode takes rms" in why


def test_forms_the_configuration_declares_and_the_loop_does_not_compute_are_refused():
    # OLMoE clamps q, k and v where its configuration sets clip_qkv (released configs do not).
    import moe_hosts

    olmoe = moe_hosts.olmoe()
    olmoe.config.clip_qkv = 8.0
    with pytest.raises(S.Refused, match=r"clamps q, k and v to \+-8 \(clip_qkv\)"):
        S.decode_loop(olmoe, max_len=32)
    # Each layer type's rotary must be one the binding takes, not only the first one named.
    gemma = decoder_hosts.gemma3()
    gemma.config.rope_parameters = {
        "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
        "full_attention": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0}}
    plan = S.decode.plan_decode(gemma, 32)
    assert plan.fits and not plan.ok
    assert plan.refused[0][1] == "rotary form 'linear+yarn' (supported: default, linear)"


def test_fixed_rotary_tables_are_followed_and_longrope_within_its_short_range():
    """YaRN's table is fixed: the loop takes the module's (frequencies and cos/sin scale).
    LongRoPE's module holds its short factors until a position passes the pretraining length,
    so a window within it is computed and a longer one refused with the length named."""
    from transformers import LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM

    torch.manual_seed(27)
    yarn = LlamaForCausalLM(LlamaConfig(
        vocab_size=hosts.VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=256,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                         "original_max_position_embeddings": 64})).eval()
    loop = S.decode_loop(yarn, max_len=48)
    assert loop.plan.config.rotaries[0].attention_scaling > 1.0  # yarn's mscale, the module's
    _same_tokens(yarn, loop, hosts.ids(8, seed=3), 32)
    half = 128 // 4 // 2
    torch.manual_seed(28)
    longrope = Phi3ForCausalLM(Phi3Config(**decoder_hosts._common(
        hidden_size=128, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=256, original_max_position_embeddings=64,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                         "short_factor": [1.0 + 0.1 * i for i in range(half)],
                         "long_factor": [2.0 + 0.5 * i for i in range(half)],
                         "original_max_position_embeddings": 64}))).eval()
    loop = S.decode_loop(longrope, max_len=64)
    _same_tokens(longrope, loop, hosts.ids(8, seed=4), 40)
    with pytest.raises(S.Refused, match="longrope switches to its long factors past 64 "
                                        "positions"):
        S.decode_loop(longrope, max_len=65)

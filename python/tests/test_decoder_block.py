"""decoder_block on real transformers hosts: a pre-norm layer whose every part is seated runs as
one block (two calls into the core around the host's own cache update). Its outputs are its
parts' seats' bit for bit, a prompt goes to the host's layer, its first decode call is checked
against the host's layer, a layer of another composition is refused by form and a layer with a
part at host is kept naming it; detach gives the layer back."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import (
    DynamicCache,
    GraniteConfig,
    GraniteForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import flashrt_structures as S
from flashrt_structures.block_seats import BlockSeatModule, build_block_seat

import hosts

EVERY = S.list_structures()
WITHOUT_BLOCKS = [s for s in EVERY if s != "decoder_block"]


def mistral(layers: int = 2) -> MistralForCausalLM:
    torch.manual_seed(7)
    cfg = MistralConfig(vocab_size=hosts.VOCAB, hidden_size=256, intermediate_size=640,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=256, sliding_window=None)
    return MistralForCausalLM(cfg).eval()


def granite(layers: int = 2) -> GraniteForCausalLM:
    """Granite scales each sublayer's output before the residual add (residual_multiplier)."""
    torch.manual_seed(8)
    cfg = GraniteConfig(vocab_size=hosts.VOCAB, hidden_size=256, intermediate_size=640,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=256, residual_multiplier=0.5,
                        embedding_multiplier=2.0, attention_multiplier=0.1, logits_scaling=2.0)
    return GraniteForCausalLM(cfg).eval()


FAMILIES = {"qwen3": lambda: hosts.qwen3(2), "llama": lambda: hosts.llama(2), "mistral": mistral}


def plan_of(model, structures=None, scheme="w8a16_decode"):
    step = hosts.ids(1, seed=3)
    return S.auto_swaps(model, lambda: model(step), scheme=scheme, structures=structures,
                        min_seat_weights=0)


def blocks(plan) -> dict[str, BlockSeatModule]:
    return {p: s for p, s in plan.swaps.items() if isinstance(s, BlockSeatModule)}


generate = hosts.generate_attached


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_prompt_and_32_steps_equal_the_sublayer_seats_bit_for_bit(family):
    model = FAMILIES[family]()
    with_blocks, without = plan_of(model), plan_of(model, WITHOUT_BLOCKS)
    layers = model.config.num_hidden_layers
    assert sorted(blocks(with_blocks)) == [f"model.layers.{i}" for i in range(layers)]
    assert not blocks(without)
    prompt = hosts.ids(7)
    got, report = generate(model, with_blocks, prompt)
    want, _ = generate(model, without, prompt)
    assert torch.equal(got.sequences, want.sequences)
    assert all(torch.equal(a, b) for a, b in zip(got.logits, want.logits, strict=True))
    for i in range(layers):
        r = report[f"model.layers.{i}"]
        # The prompt is the host's layer; each of the 31 decode steps one block call, the first
        # of them the self-check's (the host's output returned, the block's tail compared).
        assert r["band_dispatches"] == 1 and r["fallbacks"] == 0 and not r["restored"], r
        assert r["calls"] == 1 + 31, r


def test_detach_gives_the_layer_back_and_the_hosts_bytes_are_unchanged():
    model = hosts.qwen3(2)
    layer = model.model.layers[0]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = dict(model.named_parameters())
    x = hosts.ids(1)
    with torch.no_grad():
        want = model(x).logits
    plan = plan_of(model)
    handle = plan.attach(model)
    assert isinstance(model.model.layers[0], BlockSeatModule)
    # The block's children are the layer's own (its parts' seats while attached).
    assert model.model.layers[0].mlp is layer.mlp
    assert list(model.state_dict()) == list(before)
    handle.detach()
    assert model.model.layers[0] is layer
    with torch.no_grad():
        assert torch.equal(model(x).logits, want)
    for n, p in model.named_parameters():
        assert p is params[n] and torch.equal(p.detach(), before[n])


def test_a_scaled_residual_is_refused_by_form_and_its_parts_keep_their_seats():
    model = granite()
    plan = plan_of(model)
    refused = dict(plan.notes["refused"])
    for i in range(2):
        why = refused[f"model.layers.{i}"]
        assert "decoder_block: form 'other' outside {pre_norm_residual} (hidden 256)" in why
        assert f"does not read x + model.layers.{i}.self_attn's output (a scaled residual" in why
    assert not blocks(plan)
    assert "model.layers.0.mlp" in plan.swaps and "model.layers.0.self_attn.q_proj" in plan.swaps


def test_a_layer_whose_part_stays_with_the_host_is_kept_naming_the_part():
    model = hosts.qwen3(2)
    plan = plan_of(model, [s for s in EVERY if s != "attention_core"])
    assert not blocks(plan)
    kept = plan.notes["scheme"]["keep_host"]
    assert "not every part has a seat (attention model.layers.0.self_attn)" in kept[
        "model.layers.0"]
    # Asked for alone, the block has no parts: kept, never silent.
    alone = plan_of(model, ["decoder_block"])
    assert not alone.swaps
    assert "not every part has a seat" in alone.notes["scheme"]["keep_host"]["model.layers.1"]
    # A scheme that seats nothing keeps it with the reason.
    none = plan_of(model, scheme="none")
    assert "seats nothing" in none.notes["scheme"]["keep_host"]["model.layers.0"]


def test_a_failed_self_check_gives_the_layer_back_for_good():
    model = hosts.llama(2)
    plan, without = plan_of(model), plan_of(model, WITHOUT_BLOCKS)
    for block in blocks(plan).values():
        block._pass = 1.5  # no cosine reaches it: the check fails on the first decode call
    layer = model.model.layers[0]
    prompt = hosts.ids(5)
    handle = plan.attach(model)
    try:
        with pytest.warns(RuntimeWarning, match="self-check against the host's layer: k cosine"):
            with torch.no_grad():
                got = model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                                     output_logits=True, return_dict_in_generate=True)
        assert model.model.layers[0] is layer  # given back while still attached
        r = {x["site"]: x for x in handle.report()}["model.layers.0"]
        assert r["restored"] and r["fallbacks"] == 1 and "self-check" in r["last_reason"], r
    finally:
        handle.detach()
    want, _ = generate(model, without, prompt, new=8)
    assert torch.equal(got.sequences, want.sequences)
    assert all(torch.equal(a, b) for a, b in zip(got.logits, want.logits, strict=True))
    # For good: the same seats are not attached again.
    with pytest.raises(ValueError, match="gave its region back"):
        plan.attach(model)
    assert model.model.layers[0] is layer


def test_the_self_check_catches_a_composition_the_identities_did_not_name():
    # The block built with k's and v's seats swapped (equal widths, so it builds): the first
    # decode call compares it with the host's layer and gives the layer back.
    model = hosts.qwen3(2)
    plan = plan_of(model)
    sp = next(s for s in plan.seams if s.op == S._core.OpKind.block
              and s.site == "model.layers.0")
    nodes = dict(sp.seam.nodes)
    swapped = dict(plan.swaps)
    swapped[nodes["k"]], swapped[nodes["v"]] = plan.swaps[nodes["v"]], plan.swaps[nodes["k"]]
    swaps = dict(plan.swaps)
    swaps["model.layers.0"] = build_block_seat(model, sp, swapped)
    handle = S.swap.attach(model, swaps)
    try:
        with pytest.warns(RuntimeWarning, match="self-check against the host's layer: k cosine"):
            with torch.no_grad():
                model(hosts.ids(1))
        r = {x["site"]: x for x in handle.report()}
        assert r["model.layers.0"]["restored"] and not r["model.layers.1"]["restored"]
        assert not isinstance(model.model.layers[0], BlockSeatModule)
        assert isinstance(model.model.layers[1], BlockSeatModule)
    finally:
        handle.detach()


def test_batched_decode_with_left_padding_and_a_static_cache_equal_the_sublayer_seats():
    model = hosts.qwen3(2)
    without = plan_of(model, WITHOUT_BLOCKS)
    prompt = torch.cat([hosts.ids(6, seed=1), hosts.ids(6, seed=2)])
    mask = torch.ones_like(prompt)
    mask[0, :2] = 0  # the first row is left-padded
    for kw in ({"attention_mask": mask}, {"cache_implementation": "static"}):
        with_blocks = plan_of(model)  # a fresh ledger
        got, report = generate(model, with_blocks, prompt, new=12, **kw)
        want, _ = generate(model, without, prompt, new=12, **kw)
        assert torch.equal(got.sequences, want.sequences), kw
        assert all(torch.equal(a, b) for a, b in zip(got.logits, want.logits, strict=True)), kw
        r = report["model.layers.1"]
        assert r["calls"] == 12 and r["fallbacks"] == 0, (kw, r)


def test_calls_the_block_does_not_take_run_the_hosts_layer_counted():
    model = hosts.qwen3(1)
    plan = plan_of(model)
    handle = plan.attach(model)
    block = model.model.layers[0]
    try:
        with torch.no_grad():
            model(hosts.ids(1))  # the self-check's call
            x = torch.randn(1, 1, 256)
            rotary = model.model.rotary_emb(x, torch.zeros(1, 1, dtype=torch.long))
            cache = fresh_cache(model)
            want = block.host(x, position_embeddings=rotary, cache=fresh_cache(model))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                cases = [
                    ({"position_embeddings": rotary, "cache": cache, "s_aux": torch.ones(4)},
                     "the call passes s_aux"),
                    ({"position_embeddings": rotary}, "no cache object with update() in the call"),
                ]
                for kwargs, reason in cases:
                    out = block(x, **kwargs)
                    led = block.seat.ledger
                    assert led.last_reason == reason, led.last_reason
                    assert out.shape == want.shape
            strided = torch.randn(1, 1, 512)[..., ::2]
            with pytest.warns(RuntimeWarning, match="not contiguous"):
                block(strided, position_embeddings=rotary, cache=fresh_cache(model))
    finally:
        handle.detach()


def fresh_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


def test_the_gated_door_measures_the_block_as_its_own_unit():
    # Wide enough that k and v pass the keep-at-host weight count (the door's default).
    torch.manual_seed(9)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=hosts.VOCAB, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=4, head_dim=64,
        max_position_embeddings=256)).eval()
    step = hosts.ids(1, seed=3)
    result = S.attach(model, lambda: model(step), scheme="w8a16_decode", rounds=1, iters=2,
                      min_speedup=0.0)
    try:
        unit = result.units["decoder_block"]
        # Measured with the parts whose seats it runs, and kept with them.
        assert unit["decision"].startswith("activated") and unit["seats"] > 2, unit
        assert unit["parity"]["band"] == "pass", unit
        assert all(result.units[u]["decision"].startswith("activated")
                   for u in ("norm_fused", "linear_proj", "decoder_ffn", "attention_core",
                             "rotary_embed"))
        assert isinstance(model.model.layers[0], BlockSeatModule)
    finally:
        result.detach()

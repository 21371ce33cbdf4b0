"""encoder_ffn, the structure added as catalog data plus an op in flashrt/ffn: the non-gated GELU
feed-forward with biases, seated as one fused seat on Phi and GPT-NeoX, and refused by name where a
family splits it across modules (BERT), so its projections stay linear_proj seats."""

from __future__ import annotations

import pytest
import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, PhiConfig, PhiForCausalLM

import flashrt_structures as S

import hosts


def phi(layers: int = 2, act: str = "gelu_new") -> PhiForCausalLM:
    torch.manual_seed(4)
    cfg = PhiConfig(vocab_size=hosts.VOCAB, hidden_size=256, intermediate_size=1024,
                    num_hidden_layers=layers, num_attention_heads=4, hidden_act=act,
                    max_position_embeddings=256)
    return PhiForCausalLM(cfg).eval()


def neox(layers: int = 2, act: str = "gelu") -> GPTNeoXForCausalLM:
    torch.manual_seed(5)
    cfg = GPTNeoXConfig(vocab_size=hosts.VOCAB, hidden_size=256, intermediate_size=1024,
                        num_hidden_layers=layers, num_attention_heads=4, hidden_act=act,
                        max_position_embeddings=256)
    return GPTNeoXForCausalLM(cfg).eval()


def counts(plan) -> dict[str, int]:
    out: dict[str, int] = {}
    for sp in plan.seams:
        out[sp.seam.structure] = out.get(sp.seam.structure, 0) + 1
    return out


def mlp_paths(model) -> list[str]:
    return [p for p, m in model.named_modules() if type(m).__name__.endswith("MLP")]


@pytest.mark.parametrize("make,act", [(phi, S._core.Activation.gelu_tanh),
                                      (neox, S._core.Activation.gelu)])
def test_every_mlp_is_one_encoder_ffn_seat_with_its_biases(make, act):
    model = make(3)
    x = hosts.ids(12)
    plan = S.auto_swaps(model, lambda: model(x), scheme="w8a16_decode", min_seat_weights=0)
    ffn = [sp for sp in plan.seams if sp.seam.structure == "encoder_ffn"]
    assert sorted(sp.site for sp in ffn) == sorted(mlp_paths(model))
    assert all(sp.op == S._core.OpKind.ffn and sp.impl == "ffn_w8g64a16" for sp in ffn)
    assert {sp.activation for sp in ffn} == {act}
    assert all({"up", "up_bias", "down", "down_bias"} <= set(sp.slots) for sp in ffn)
    assert not any("encoder_ffn" in why for _, why in plan.notes["refused"])
    text = S.explain(plan)
    assert "encoder_ffn up [1024x256], down [256x1024] -> ffn_w8g64a16" in text


@pytest.mark.parametrize("make", [phi, neox])
def test_logits_of_the_seated_host_match_and_detach_is_bit_exact(make):
    model = make(2)
    x = hosts.ids(12)
    with torch.no_grad():
        want = model(x).logits
    plan = S.auto_swaps(model, lambda: model(x), scheme="w8a16_decode", min_seat_weights=0)
    handle = plan.attach(model)
    with torch.no_grad():
        got = model(x).logits
    rows = [r for r in handle.report() if r["structure"] == "encoder_ffn"]
    assert len(rows) == 2 and all(r["calls"] == 1 and r["fallbacks"] == 0 for r in rows)
    handle.detach()
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    assert cos >= 0.999, cos
    with torch.no_grad():
        assert torch.equal(model(x).logits, want)


def test_one_bound_encoder_ffn_is_certified_against_the_module():
    model = phi(1)
    mlp = model.model.layers[0].mlp
    xs = [torch.randn(r, 256, generator=torch.Generator().manual_seed(r)) for r in (1, 3, 16)]
    bound = S.get("encoder_ffn").bind(mlp, calibration=xs)
    assert bound.certification["structure"] == "encoder_ffn"
    assert bound.certification["worst_cos"] >= 0.999
    with torch.no_grad():
        y = bound(xs[1])
    assert y.shape == (3, 256)


@pytest.mark.parametrize("scheme,impl,form", [
    ("w4a16_decode", "ffn_w4g32a16", "int4 g32 asymmetric f16 scales"),
    ("w4a16_sym_decode", "ffn_w4a16", "int4 g32 symmetric")])
def test_w4_keeps_the_fused_seat_and_an_odd_width_steps_aside_to_int8(scheme, impl, form):
    model = phi(1)
    x = hosts.ids(8)
    plan = S.auto_swaps(model, lambda: model(x), scheme=scheme, min_seat_weights=0)
    ffn = [sp for sp in plan.seams if sp.seam.structure == "encoder_ffn"]
    assert [sp.impl for sp in ffn] == [impl]
    assert ffn[0].form.describe() == form


def test_an_activation_outside_the_boundary_is_refused_and_projections_stay_linear():
    model = neox(1, act="relu")
    x = hosts.ids(8)
    plan = S.auto_swaps(model, lambda: model(x), scheme="w8a16_decode", min_seat_weights=0)
    refused = dict(plan.notes["refused"])
    why = refused["gpt_neox.layers.0.mlp"]
    assert "encoder_ffn: activation 'relu' outside {gelu, gelu_tanh}" in why
    assert "up [1024x256], down [256x1024]" in why
    sites = {sp.site for sp in plan.seams if sp.seam.structure == "linear_proj"}
    assert {"gpt_neox.layers.0.mlp.dense_h_to_4h", "gpt_neox.layers.0.mlp.dense_4h_to_h"} <= sites


@pytest.mark.real_model
def test_a_feed_forward_split_across_modules_is_named_and_stays_projections():
    model, tok = hosts.minilm()
    enc = tok(["flashrt seats what its structures describe"], return_tensors="pt")
    plan = S.auto_swaps(model, lambda: model(**enc), scheme="w8a16_decode")
    refused = dict(plan.notes["refused"])
    split = {site: why for site, why in refused.items() if why.startswith("encoder_ffn:")}
    assert len(split) == 6  # one per BERT layer
    why = split["encoder.layer.0.intermediate"]
    assert "split across modules encoder.layer.0.intermediate (up, act) and " \
           "encoder.layer.0.output (down)" in why
    assert counts(plan) == {"linear_proj": 37, "attention_core": 6}

"""Norm and attention seats on real transformers hosts: norm_fused replaces a norm module's
forward (x*w and Gemma's x*(1+w), the module's epsilon), attention_core serves decode rows through
transformers' attention interface (the host's cache, masks and layouts stay the host's). Prompt
then 32 greedy steps equal the host's; detach gives the configuration and modules back; what the
op does not take runs the host's implementation, counted; forms it does not compute are refused
by form and shape."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

import flashrt_structures as S
from flashrt_structures.observe import attention as interface

import gated_delta_hosts
import hosts
import moe_hosts

STRUCTURES = ["norm_fused", "attention_core"]


def gemma3(layers: int = 4) -> Gemma3ForCausalLM:
    """Gemma 3: q/k norms and every norm x*(1+w), sliding-window layers beside a global one."""
    torch.manual_seed(4)
    cfg = Gemma3TextConfig(vocab_size=hosts.VOCAB, hidden_size=256, intermediate_size=512,
                           num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=64, max_position_embeddings=256, sliding_window=16,
                           sliding_window_pattern=2)
    return Gemma3ForCausalLM(cfg).eval()


def gemma2() -> Gemma2ForCausalLM:
    """Gemma 2: softcapped attention scores, which transformers computes with eager attention."""
    torch.manual_seed(5)
    cfg = Gemma2Config(vocab_size=hosts.VOCAB, hidden_size=256, intermediate_size=512,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=64, max_position_embeddings=256, sliding_window=64,
                       attn_logit_softcapping=5.0, attn_implementation="eager")
    return Gemma2ForCausalLM(cfg).eval()


# The routed-MoE families pass output_router_logits down to every attention call, which changes
# nothing the op computes (their attention was once refused for it).
FAMILIES = {"qwen3": lambda: hosts.qwen3(2), "llama": lambda: hosts.llama(2), "gemma3": gemma3,
            "gemma2": gemma2, **gated_delta_hosts.FAMILIES, **moe_hosts.FAMILIES}


def attention_modules(model) -> list[str]:
    return [p for p, m in model.named_modules()
            if hasattr(m, "o_proj") and hasattr(m, "q_proj") and not hasattr(m, "in_proj_qkv")]


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(),
                                                 dim=0).item()


def greedy(model, prompt: torch.Tensor, new: int):
    with torch.no_grad():
        return model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              output_logits=True, return_dict_in_generate=True)


def plan_for(model):
    step = hosts.ids(1)
    return S.auto_swaps(model, [lambda: model(hosts.ids(6)), lambda: model(step)],
                        scheme="w8a16_decode", structures=STRUCTURES)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_prompt_and_32_steps_equal_the_hosts_and_detach_gives_everything_back(family):
    model = FAMILIES[family]()
    config_impl = model.config._attn_implementation
    prompt = hosts.ids(8, seed=7)
    want = greedy(model, prompt, 32)
    snap = hosts.snapshot(model)
    modules = dict(model.named_modules())
    plan = plan_for(model)
    seated = {sp.site: sp for sp in plan.seams}
    # Every attention module is seated (Qwen3.5's gated delta layers have none), every norm with
    # a weight of its own is seated or refused by its form.
    for path in attention_modules(model):
        assert seated[path].seam.structure == "attention_core", S.explain(plan)
    assert sum(sp.seam.structure == "norm_fused" for sp in plan.seams) >= 2, S.explain(plan)
    handle = plan.attach(model)
    try:
        got = greedy(model, prompt, 32)
        report = handle.report()
    finally:
        handle.detach()
    assert torch.equal(got.sequences, want.sequences), family
    assert min(cosine(a, b) for a, b in zip(got.logits, want.logits)) >= 0.9999
    attention = [r for r in report if r["structure"] == "attention_core"]
    # Each attention seat ran every decode step (the prompt was a band dispatch), nothing fell back.
    assert attention and all(r["calls"] - r["band_dispatches"] >= 31 and r["fallbacks"] == 0
                             for r in attention), attention
    assert all(r["fallbacks"] == 0 for r in report), report
    assert model.config._attn_implementation == config_impl
    assert not interface._PLACES and not interface._ROUTES  # every router and route taken out
    assert dict(model.named_modules()).keys() == modules.keys()
    assert all(m is modules[n] for n, m in model.named_modules())
    assert hosts.same_weights(model, snap)
    with torch.no_grad():
        assert torch.equal(greedy(model, prompt, 4).sequences, want.sequences[:, :12])


def test_a_moe_forward_asking_for_router_logits_runs_the_attention_seats():
    """output_router_logits=True asks the routers, not attention, for something: the seated
    attention serves the step, and the logits and every layer's router logits match the host's."""
    model = moe_hosts.qwen3_moe()
    want, got, report = moe_hosts.step_asking_for_router_logits(model, plan_for(model))
    attention = [r for r in report.values() if r["structure"] == "attention_core"]
    assert len(attention) == len(attention_modules(model))
    assert all(r["calls"] - r["band_dispatches"] == 1 and r["fallbacks"] == 0
               for r in attention), attention
    assert cosine(got.logits, want.logits) >= 0.9999
    assert len(got.router_logits) == len(want.router_logits) == len(model.model.layers)
    # The routers read hidden states the seated attention wrote (its own fp32 summation order).
    assert min(cosine(a, b) for a, b in zip(got.router_logits, want.router_logits)) >= 0.9999


def test_softcapped_scores_are_seated_in_their_form_and_match_eager():
    model = gemma2()
    plan = plan_for(model)
    text = S.explain(plan)
    assert "softcap 5 -> attention_f32" in text, text
    want = greedy(model, hosts.ids(5, seed=2), 8)
    handle = plan.attach(model)
    try:
        got = greedy(model, hosts.ids(5, seed=2), 8)
    finally:
        handle.detach()
    assert torch.equal(got.sequences, want.sequences)
    assert min(cosine(a, b) for a, b in zip(got.logits, want.logits)) >= 0.9999


def test_a_left_padded_batch_runs_the_seats_over_each_rows_attended_range():
    """The model's mask hides each row's padding: one range of attended positions per row, which
    the seat reads (the rows of a batch attend different ranges of the host's cache)."""
    model = hosts.qwen3(2)
    prompt = torch.stack([hosts.ids(6, seed=1)[0], hosts.ids(6, seed=2)[0]])
    mask = torch.ones_like(prompt)
    mask[1, :2] = 0
    with torch.no_grad():
        want = model.generate(prompt, attention_mask=mask, max_new_tokens=6, do_sample=False,
                              output_logits=True, return_dict_in_generate=True)
    handle = plan_for(model).attach(model)
    try:
        with torch.no_grad():
            got = model.generate(prompt, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True)
        attention = [r for r in handle.report() if r["structure"] == "attention_core"]
    finally:
        handle.detach()
    assert torch.equal(got.sequences, want.sequences)
    assert min(cosine(a, b) for a, b in zip(got.logits, want.logits)) >= 0.9999
    assert all(r["calls"] - r["band_dispatches"] == 5 and r["fallbacks"] == 0
               for r in attention), attention


class RoutedLayer:
    """A one-layer Qwen3 attached, with its attention seat's handler and the host's function:
    calls handed straight to the seat, as the router hands them, against the host's."""

    SITE = "model.layers.0.self_attn"

    def __enter__(self):
        model = hosts.qwen3(1)
        self.attn = model.model.layers[0].self_attn
        self.handle = plan_for(model).attach(model)
        self.seat = interface._ROUTES[id(self.attn)][1]()  # the seat's handler (held weakly)
        self.host = interface.host_implementation(self.attn)
        return self

    def __exit__(self, *exc):
        self.handle.detach()
        return False

    def fallbacks(self) -> int:
        return next(r for r in self.handle.report() if r["site"] == self.SITE)["fallbacks"]

    def falls_back(self, q, k, mask, kwargs, reason: str) -> None:
        """The call runs the host's function, counted once, warning with `reason`."""
        before = self.fallbacks()
        with torch.no_grad(), pytest.warns(RuntimeWarning, match=re.escape(reason)):
            self.seat(self.host, self.attn, q, k, k, mask, kwargs)
        assert self.fallbacks() == before + 1, reason

    def matches_host(self, q, k, mask, kwargs) -> None:
        with torch.no_grad():
            out, _ = self.seat(self.host, self.attn, q, k, k, mask, kwargs)
            ref, _ = self.host(self.attn, q, k, k, mask, **kwargs)
        assert cosine(out, ref) >= 0.99999


def test_a_mask_the_op_does_not_read_runs_the_hosts_implementation_counted():
    """A mask with a hole in a row's attended positions, or a bias of other values: the host's
    implementation runs with the same arguments, counted with the reason."""
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 4, 1, 64, generator=gen), torch.randn(1, 2, 6, 64, generator=gen)
    holed = torch.tensor([True, True, False, True, True, True]).view(1, 1, 1, 6)
    bias = torch.zeros(1, 1, 1, 6)
    bias[..., 0] = -0.5
    with RoutedLayer() as layer:
        layer.falls_back(q, k, holed, {}, "not one range")
        layer.falls_back(q, k, bias, {}, "a bias")
        # A range the op reads: the seat's output against the host's on the same mask.
        tail = torch.tensor([False, False, True, True, True, True]).view(1, 1, 1, 6)
        layer.matches_host(q, k, tail, {})
        assert layer.fallbacks() == 2


def test_calls_out_of_form_fall_back_counted():
    """Calls the router hands the seat that the op does not take (another dtype, another head
    size, attention sinks, the weights asked for): each runs the host's function, counted."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 1, 64, generator=gen), torch.randn(1, 2, 5, 64, generator=gen)
    with RoutedLayer() as layer:
        layer.falls_back(q.bfloat16(), k.bfloat16(), None, {}, "input dtype bf16")
        layer.falls_back(q[..., :32], k[..., :32], None, {}, "expected [-1, 4, 1, 64]")
        layer.falls_back(q, k, None, {"s_aux": torch.zeros(4)}, "the call passes s_aux")
        layer.falls_back(q, k, None, {"output_attentions": True},
                         "the call passes output_attentions")
        layer.matches_host(q, k, None, {"scaling": 0.125})


def test_forms_outside_the_ops_are_refused_by_form_and_shape():
    # GPT-OSS passes attention sinks: the op computes no sinks, so its attention is refused.
    model = moe_hosts.gpt_oss(2)
    plan = plan_for(model)
    refused = dict(plan.notes["refused"])
    why = refused["model.layers.0.self_attn"]
    assert "attention_core: form 'other' outside {softmax, softcapped}" in why, why
    assert "s_aux" in why, why
    # A bf16 host: the ops read fp32 activations.
    bf16 = hosts.qwen3(1).to(torch.bfloat16)
    plan = plan_for(bf16)
    refused = dict(plan.notes["refused"])
    assert "activations bf16" in refused["model.layers.0.self_attn"], refused
    # (Its norms are refused too: measured in bf16 they do not reproduce an fp32 form.)
    assert refused["model.layers.0.input_layernorm"].startswith("norm_fused: "), refused
    assert not plan.seams

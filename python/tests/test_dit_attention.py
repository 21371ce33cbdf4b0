"""The attention a diffusion transformer computes over whole sequences (attention_sequence): real
diffusers DiTs (PixArt, SD3, Flux, Wan) in bf16, their processors' calls of torch's
scaled_dot_product_attention seated on flashrt/gemm's sequence attention; an f32 host, masked
calls, autograd and other callers of the function left with torch, by name."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import flashrt_structures as S
from flashrt_structures import impls

import dit_hosts

STRUCTURE = "attention_sequence"
SDPA = torch.nn.functional.scaled_dot_product_attention


# The structure's rung pays on flashrt/gemm's amx build only (catalog/ladders.yaml `builds`).
BUILD = impls.resolve("flashrt/gemm").chosen


def planned(model: nn.Module, steps: Any) -> Any:
    """The bf16 host's plan of attention_sequence alone. Off the amx build every module's seam is
    refused naming the build (asserted), and the test skips: there is nothing seated to test."""
    plan = S.auto_swaps(model, steps, scheme="w8a8_dynamic", structures=[STRUCTURE])
    if BUILD.endswith("-amx"):
        return plan
    refused = dict(plan.notes["refused"])
    assert not plan.swaps and set(refused) == attention_modules(model), S.explain(plan)
    assert all(f"flashrt/gemm's build here is {BUILD}; this rung pays on its amx build only"
               in why for why in refused.values()), refused
    pytest.skip(f"flashrt/gemm resolved {BUILD}: attention_sequence pays on amx only "
                "(its refusal asserted)")


def sample(out: Any) -> torch.Tensor:
    return out.sample


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(),
                                                 dim=0).item()


def to_bf16(model: nn.Module) -> nn.Module:
    """The host in bf16, its floating inputs cast on the way in (the step closures build f32)."""
    model.to(torch.bfloat16)

    def cast(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        def one(v: Any) -> Any:
            return v.bfloat16() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}

    model.register_forward_pre_hook(cast, with_kwargs=True)
    return model


def attention_modules(model: nn.Module) -> set[str]:
    """diffusers' attention modules (each holds the processor that calls torch's function)."""
    return {p for p, m in model.named_modules() if hasattr(m, "processor") and p}


def sdpa_calls(model: nn.Module, step: Any) -> dict[str, int]:
    """How many times each attention module's processor called torch's function in one step,
    counted by a wrapper of our own, apart from the door's observation."""
    counts: dict[str, int] = {}
    stack: list[str] = []
    handles = []

    def pop(_m: nn.Module, _a: Any, _o: Any) -> None:
        stack.pop()

    for path in attention_modules(model):
        m = model.get_submodule(path)
        handles.append(m.register_forward_pre_hook(lambda _m, _a, p=path: stack.append(p)))
        handles.append(m.register_forward_hook(pop))

    def counted(*args: Any, **kwargs: Any) -> Any:
        if stack:
            counts[stack[-1]] = counts.get(stack[-1], 0) + 1
        return SDPA(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = counted
    try:
        with torch.no_grad():
            step()
    finally:
        torch.nn.functional.scaled_dot_product_attention = SDPA
        for h in handles:
            h.remove()
    return counts


@pytest.fixture(scope="module", params=sorted(dit_hosts.FAMILIES))
def host(request):
    model, step = dit_hosts.FAMILIES[request.param]()
    to_bf16(model)
    with torch.no_grad():
        want = sample(step())
    return request.param, model, step, want


def test_every_attention_module_of_a_bf16_dit_is_seated_and_matches_torch(host):
    name, model, step, want = host
    calls = sdpa_calls(model, step)
    assert calls and set(calls) == attention_modules(model), (name, calls)
    plan = planned(model, step)
    seated = {sp.site for sp in plan.seams if sp.seam.structure == STRUCTURE}
    assert seated == set(calls), S.explain(plan)
    assert not plan.notes["refused"], plan.notes["refused"]
    for sp in plan.seams:
        assert sp.impl == "sequence_attention_bf16" and sp.package == "flashrt/gemm"
        assert sp.seam.attention.cache == S._core.AttentionCache.none
    handle = plan.attach(model)
    try:
        assert torch.nn.functional.scaled_dot_product_attention is not SDPA  # the dispatch
        with torch.no_grad():
            got = sample(step())
        ledger = {r["site"]: r for r in handle.report()}
    finally:
        handle.detach()
    assert torch.nn.functional.scaled_dot_product_attention is SDPA  # the very object back
    for site, n in calls.items():
        assert ledger[site]["calls"] == n and ledger[site]["fallbacks"] == 0, ledger[site]
    # Both arms round to bf16 (weights before they weight V, and the output); values, not argmax.
    assert not torch.equal(got, want)  # the op ran
    assert cosine(got, want) >= 0.9999, (name, cosine(got, want))
    err = (got.double() - want.double()).abs().max() / want.double().abs().max()
    assert err < 0.02, (name, float(err))
    with torch.no_grad():
        assert torch.equal(sample(step()), want)  # detached: torch's bits


def test_an_f32_dit_is_refused_by_dtype_at_every_attention_module():
    model, step = dit_hosts.pixart(layers=1)
    plan = S.auto_swaps(model, step, scheme="w8a8_dynamic", structures=[STRUCTURE])
    assert not plan.swaps
    refused = dict(plan.notes["refused"])
    assert set(refused) == attention_modules(model), S.explain(plan)
    for why in refused.values():
        assert ("attention_sequence 8 heads / 8 kv of 64: activations f32 in the observed "
                "forward; impls take bf16") in why, why


def pixart_masked(masks: list[torch.Tensor | None]) -> tuple[nn.Module, list[Any]]:
    """A bf16 PixArt with a caption mask (1 kept, 0 hidden) on each step: diffusers turns it into
    the bias -10000 (1 - mask) (-9984 in bf16) the cross-attention hands torch's function."""
    model, _ = dit_hosts.pixart(layers=1)
    to_bf16(model)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 4, 32, 32, generator=g)
    e = torch.randn(1, dit_hosts.TEXT, 64, generator=g)
    t = torch.tensor([500])
    steps = [lambda m=m: model(x, encoder_hidden_states=e, timestep=t, encoder_attention_mask=m)
             for m in masks]
    return model, steps


def padding(hidden: list[int]) -> torch.Tensor:
    mask = torch.ones(1, dit_hosts.TEXT)
    mask[:, hidden] = 0
    return mask


def test_a_caption_padding_mask_is_served_as_the_range_of_keys_it_keeps():
    model, steps = pixart_masked([padding([8, 9, 10, 11])])  # the caption's last 4: padding
    with torch.no_grad():
        want = sample(steps[0]())
    plan = planned(model, steps)
    assert {sp.site for sp in plan.seams} == {"transformer_blocks.0.attn1",
                                               "transformer_blocks.0.attn2"}, S.explain(plan)
    handle = plan.attach(model)
    try:
        with torch.no_grad():
            got = sample(steps[0]())
        ledger = {r["site"]: r for r in handle.report()}
    finally:
        handle.detach()
    cross = ledger["transformer_blocks.0.attn2"]
    assert cross["calls"] == 1 and cross["fallbacks"] == 0, cross
    assert not torch.equal(got, want) and cosine(got, want) >= 0.99998, cosine(got, want)
    # The mask did its work: the same host unmasked is further from the masked host's step.
    _, (plain,) = pixart_masked([None])
    with torch.no_grad():
        unmasked = sample(plain())
    assert cosine(unmasked, want) < 0.99995  # (0.99989 here: the padding's weight)
    assert (got - want).abs().max() < (unmasked - want).abs().max() / 2


def test_a_mask_whose_kept_keys_are_not_one_range_runs_torchs_counted_with_the_reason():
    model, steps = pixart_masked([None, padding([3, 10, 11])])  # a hole at 3: not one range
    plan = planned(model, steps)
    assert {sp.site for sp in plan.seams} == {"transformer_blocks.0.attn1",
                                               "transformer_blocks.0.attn2"}, S.explain(plan)
    handle = plan.attach(model)
    try:
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            steps[1]()
        ledger = {r["site"]: r for r in handle.report()}
    finally:
        handle.detach()
    cross = ledger["transformer_blocks.0.attn2"]
    assert cross["fallbacks"] == 1, cross
    assert any("the attended keys are not one range" in r for r in cross["reasons"]), cross
    assert ledger["transformer_blocks.0.attn1"]["fallbacks"] == 0
    assert any("not one range" in str(w.message) for w in caught)


def test_autograd_and_other_callers_of_the_function_run_torchs_bit_for_bit():
    model, step = dit_hosts.sd3(layers=1)
    to_bf16(model)
    plan = planned(model, step)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 40, 64, generator=g).bfloat16() for _ in range(3))
    direct = SDPA(q, k, v)
    with torch.no_grad():
        want = sample(step())
    handle = plan.attach(model)
    try:
        # A call made by no seated module (here: none running) is torch's, the same bits.
        assert torch.equal(torch.nn.functional.scaled_dot_product_attention(q, k, v), direct)
        # With autograd on (the weights require grad), every call goes to torch's, counted.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            graded = sample(step())
        report = handle.report()
    finally:
        handle.detach()
    assert torch.equal(graded.detach(), want)
    assert all(r["fallbacks"] == r["calls"] > 0 for r in report), report
    assert all("an operand requires grad (autograd)" in r["reasons"] for r in report), report


def test_a_transformers_llm_keeps_its_attention_on_the_interface_structures():
    # Its attention modules reach torch's function through transformers' attention interface:
    # they are the interface's attention nodes (attention_core), never sequence ones.
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).eval()  # f32: the dtype attention_core takes
    ids = torch.randint(0, 256, (1, 9))
    plan = S.auto_swaps(model, lambda: model(ids), scheme="w8a16_decode",
                        structures=["attention_core", STRUCTURE])
    structures = {sp.seam.structure for sp in plan.seams}
    assert STRUCTURE not in structures and "attention_core" in structures, S.explain(plan)
    assert not any(STRUCTURE in why for _, why in plan.notes["refused"])


def test_detach_leaves_a_function_the_user_set_after_attach():
    model, step = dit_hosts.pixart(layers=1)
    to_bf16(model)
    plan = planned(model, step)
    handle = plan.attach(model)
    dispatch = torch.nn.functional.scaled_dot_product_attention

    def users_own(*args: Any, **kwargs: Any) -> Any:
        return dispatch(*args, **kwargs)

    try:
        torch.nn.functional.scaled_dot_product_attention = users_own
        handle.detach()
        assert torch.nn.functional.scaled_dot_product_attention is users_own
    finally:
        torch.nn.functional.scaled_dot_product_attention = SDPA


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_a_dit_block_around_a_sequence_attention_is_no_decoder_block_candidate(family):
    # Its attention attends whole sequences (no cache): the layer is no decoder layer, so the
    # block watch neither probes it with an extra forward nor refuses it as one.
    model, step = dit_hosts.FAMILIES[family]()
    plan = S.auto_swaps(model, step, scheme="w8a8_dynamic")
    assert not [s for s, why in plan.notes["refused"] if why.startswith("decoder_block")]
    assert {s for s, why in plan.notes["refused"] if why.startswith(STRUCTURE)} == \
        attention_modules(model)  # f32: refused by dtype, each named

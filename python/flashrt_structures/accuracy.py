"""Accuracy bands of the build-only doors: each seat run on rows its input showed in the
calibration (or observed) forwards, against the host module it stands in for, before anything
is attached.

A band is the catalog's parity band for values (gates.yaml: cosine, pass / warn / low), judged
by the core; the seat runs through `Seat.probe`, which checks the call's form as a real call
does but leaves the ledger to the host's own calls. A seat whose call is not one tensor (a bank
of experts with its router's choice, a function seat) or whose input no forward showed gets a
reason instead of a band.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _core, catalog
from .observe.calibration import Calibration
from .seats import NormSeatModule, SeatModule


def _rows_in_band(x: torch.Tensor, lo: int, hi: int) -> list[torch.Tensor]:
    """x's rows in chunks the seat serves (each within [lo, hi]); [] when too few rows."""
    if x.shape[0] < lo:
        return []
    step = max(lo, min(hi, x.shape[0]))
    chunks = [x[i:i + step] for i in range(0, x.shape[0], step)]
    return [c for c in chunks if c.shape[0] >= lo]


def seat_band(seat: SeatModule, rows: torch.Tensor | None) -> dict[str, Any]:
    """The parity of one seat on `rows` of its input: cosine, max_abs, rows and band, or why
    it was not measured."""
    if type(seat) not in (SeatModule, NormSeatModule):
        return {"band": None, "why": "its call is not one tensor (measured by attach's gate)"}
    if rows is None:
        return {"band": None, "why": "no forward showed its input"}
    form = seat.seat.form
    chunks = _rows_in_band(rows.to(_dtype(form.dtype)), form.band_min,
                           min(form.band_max, 1 << 16))
    if not chunks:
        return {"band": None, "why": f"{rows.shape[0]} rows seen, the seat serves from "
                                      f"{form.band_min}"}
    got, want = [], []
    with torch.no_grad():
        for x in chunks:
            y = x.new_empty((x.shape[0], seat.out_width))
            why = seat.seat.probe(x.contiguous(), y)
            if why:
                return {"band": None, "why": why}
            got.append(y)
            want.append(seat.host(x))
    g = torch.cat(got).float().contiguous()
    w = torch.cat(want).float().contiguous()
    m = _core.value_metrics(g, w)
    band = catalog.shipped().band(_core.OutputKind.values)
    return {"cosine": m.cosine, "max_abs": m.max_abs, "rows": int(g.shape[0]),
            "band": _core.band_name(_core.parity_band(band, m.cosine))}


def _dtype(dt: _core.DType) -> torch.dtype:
    return torch.bfloat16 if dt == _core.DType.bf16 else torch.float32


def bands(swaps: dict[str, SeatModule], calibration: Calibration) -> dict[str, dict[str, Any]]:
    """Every seat's band on the calibration's rows, keyed by the module it stands in for, with
    the calibration's source named."""
    out: dict[str, dict[str, Any]] = {}
    for path, seat in swaps.items():
        plan = seat.plan
        slots = [s.module for s in plan.slots.values()] if plan is not None else []
        if plan is not None and len(plan.replaces) > 1:
            out[path] = {"band": None, "why": "a packed seat: its columns are several modules' "
                                              "(measured by attach's gate)",
                         "source": calibration.source}
            continue
        rows = calibration.sample(path, slots)
        out[path] = {**seat_band(seat, rows), "source": calibration.source}
    return out

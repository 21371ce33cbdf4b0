"""Accuracy bands of the build-only doors: each seat run on rows its input showed in the
calibration (or observed) forwards, against the host module it stands in for, before anything
is attached.

A band is the catalog's parity band for values (gates.yaml: cosine, pass / warn / low), judged
by the core; the seat runs through `Seat.probe`, which checks the call's form as a real call
does but leaves the ledger to the host's own calls. A seat whose call is not one tensor (a bank
of experts with its router's choice, a function seat) or whose input no forward showed gets a
reason instead of a band.

The engine doors build their seats before any served call, from the weights the engine loaded:
there a seat's band is measured on the first rows it serves (`ServedBand`), its host layer run on
the same rows once per such call, and the report and receipt carry it from then on.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _core, catalog, observe
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
    return judged(torch.cat(got), torch.cat(want))


def judged(got: torch.Tensor, want: torch.Tensor) -> dict[str, Any]:
    """The catalog's values band of `got` against `want` ([rows, width] each): cosine, max_abs,
    rows and band."""
    g, w = got.float().contiguous(), want.float().contiguous()
    m = _core.value_metrics(g, w)
    band = catalog.shipped().band(_core.OutputKind.values)
    return {"cosine": m.cosine, "max_abs": m.max_abs, "rows": int(g.shape[0]),
            "band": _core.band_name(_core.parity_band(band, m.cosine))}


class ServedBand:
    """The band of a seat built before any served call (an engine door's): measured on the first
    ROWS rows it serves, against its host module run on the same rows (once per served call
    until then, on that call's rows still wanted). Whatever goes wrong in the measurement is its
    `why`, never the served call's error."""

    ROWS = 16

    def __init__(self) -> None:
        self._got: list[torch.Tensor] = []
        self._want: list[torch.Tensor] = []
        self._seen = 0
        self.result: dict[str, Any] | None = None

    def add(self, seat: SeatModule, x: torch.Tensor, out: torch.Tensor) -> None:
        """One served call: its input and the seat's output, before the caller sees it."""
        try:
            need = self.ROWS - self._seen
            rows = x.reshape(-1, x.shape[-1])[:need]
            got = out.detach().reshape(-1, out.shape[-1])[:need].float().clone()
            with torch.no_grad():
                want = observe._first_tensor(seat.host(rows))
            if not isinstance(want, torch.Tensor) or want.shape != got.shape:
                self.result = {"band": None, "why": "its host's output is not one tensor of "
                                                    f"the seat's shape {tuple(got.shape)}"}
                return
            self._got.append(got)
            self._want.append(want.detach().float().clone())
            self._seen += got.shape[0]
            if self._seen >= self.ROWS:
                self.result = judged(torch.cat(self._got), torch.cat(self._want))
                self._got, self._want = [], []
        except Exception as e:  # noqa: BLE001  (the measurement must not fail the served call)
            self.result = {"band": None, "why": f"not measured: {type(e).__name__}: {e}"}
            self._got, self._want = [], []

    def report(self) -> dict[str, Any]:
        if self.result is not None:
            return self.result
        return {"band": None, "why": f"measured on the first {self.ROWS} rows it serves: "
                                     f"{self._seen} served so far"}


def served_bands(records: list[Any]) -> dict[str, dict[str, Any]]:
    """Each seat's band on the rows it served, keyed by its site (an engine handle's records)."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        watch = r.seat.served_band
        band = (watch.report() if watch is not None
                else {"band": None, "why": "its call is not one tensor (a bank of experts "
                                           "with its router's choice, an attention layer over "
                                           "the engine's cache)"})
        out[r.site] = {**band, "source": "served calls"}
    return out


def _dtype(dt: _core.DType) -> torch.dtype:
    return torch.bfloat16 if dt == _core.DType.bf16 else torch.float32


def bands(swaps: dict[str, SeatModule], calibration: Calibration) -> dict[str, dict[str, Any]]:
    """Every seat's band on the calibration's rows, keyed by the module it stands in for, with
    the calibration's source named."""
    out: dict[str, dict[str, Any]] = {}
    for path, seat in swaps.items():
        plan = seat.plan
        slots = [s.module for s in plan.slots.values()] if plan is not None else []
        if plan is not None and plan.op == _core.OpKind.block:
            out[path] = {"band": None, "why": "a decoder block runs its parts' seats (each with "
                                              "its own band)", "source": calibration.source}
            continue
        if plan is not None and len(plan.replaces) > 1:
            out[path] = {"band": None, "why": "a packed seat: its columns are several modules' "
                                              "(measured by attach's gate)",
                         "source": calibration.source}
            continue
        rows = calibration.sample(path, slots)
        out[path] = {**seat_band(seat, rows), "source": calibration.source}
    return out

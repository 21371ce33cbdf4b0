"""The gated front door: attach(model, forward) seats only what passes its gates (DESIGN §7).

Steps: prove the measurement (the unmodified host twice, bit-identical), plan, then per unit (one
structure family) attach, score parity by output kind against the host, time host and unit
alternately, and keep the unit only if its ledger is clean and its median speedup reaches
min_speedup; finally re-check the union. When nothing wins the host is left untouched. With
scheme="auto" each unit is measured under every scheme the catalog's gated_auto lists and the
fastest that passes is kept (Note [Gated auto] in core/src/gates/gates.cpp)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import _core, catalog, swap
from . import receipt as receipts
from .autoswap import calibrate, notes_of, plan_observed
from .block_seats import BlockSeatModule
from .function_seats import FunctionSeat
from .observe import Forward, normalise_forwards, observe
from .observe.calibration import needs_moments

log = logging.getLogger("flashrt")


def output_tensor(out: Any) -> tuple[torch.Tensor, _core.OutputKind]:
    """The scored tensor of a forward's return and its kind: logits are a distribution,
    anything else values."""
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, dict):
        logits = out.get("logits")
    values = _core.OutputKind.values
    if isinstance(logits, torch.Tensor):
        return logits, _core.OutputKind.distribution
    if isinstance(out, torch.Tensor):
        return out, values
    for name in ("last_hidden_state", "sample"):
        t = getattr(out, name, None)
        if isinstance(t, torch.Tensor):
            return t, values
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0], values
    raise ValueError(f"flashrt: cannot find a tensor to score in a {type(out).__name__}")


def parity(got: torch.Tensor, want: torch.Tensor, kind: _core.OutputKind) -> dict[str, Any]:
    """The parity figures by output kind, and their band under the catalog's gates."""
    g, w = got.detach().float().contiguous(), want.detach().float().contiguous()
    if kind == _core.OutputKind.distribution:
        d = _core.distribution_metrics(g, w)
        m = {"top1_agreement": d.top1_agreement, "last_position_cosine": d.last_position_cosine,
             "max_abs": d.max_abs}
    else:
        v = _core.value_metrics(g, w)
        m = {"cosine": v.cosine, "max_abs": v.max_abs}
    band = catalog.shipped().band(kind)
    return {**m, "band": _core.band_name(_core.parity_band(band, m[band.metric]))}


def _time(fn: Callable[[], Any], iters: int) -> float:
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(iters):
            fn()
    return (time.perf_counter() - t0) / iters


@dataclass
class FrontDoorResult:
    """What attach() returns: the active handle (or none), per-unit figures, and the receipt:
    `receipt` reads as the gate's record (a dict); `receipt()` builds the full receipt, with the
    ledger as it stands then, and `save_receipt(dir)` writes it (docs/receipts.md)."""

    handle: swap.AttachHandle | None
    units: dict[str, dict[str, Any]]
    notes: dict[str, Any]
    receipt: dict[str, Any] = field(default_factory=dict)
    host: str = ""  # the host's class name, for a receipt with no handle

    def __post_init__(self) -> None:
        self.receipt = receipts.GateRecord(self.receipt, self._full_receipt)

    def _full_receipt(self) -> dict[str, Any]:
        if self.handle is not None:  # its notes carry the door and the units (attach below)
            return self.handle.receipt()
        return receipts.of_gated(None, self.notes, self.host, _measurements(self.receipt))

    def save_receipt(self, directory: str | Path) -> Path:
        """Writes receipt() to `directory`/receipt.json (the folder is created); its path."""
        return receipts.save(self._full_receipt(), directory)

    @property
    def active(self) -> bool:
        return self.handle is not None and self.handle.active

    def summary(self) -> dict[str, Any]:
        if self.handle is None:
            return {"seams": 0, "guarded_calls": 0, "fallbacks": 0, "band_dispatches": 0,
                    "restored": 0, "refused": len(self.notes.get("refused", [])), "clean": True}
        return self.handle.summary()

    def report(self) -> str:
        lines = []
        for unit, u in self.units.items():
            lines.append(f"{unit}: {u['decision']} ({u['seats']} seats, parity {u['parity']}, "
                         f"speedup {u.get('speedup', 0):.3f}x)")
        return "\n".join(lines)

    def detach(self) -> None:
        if self.handle is not None:
            self.handle.detach()


def _measurements(record: dict[str, Any]) -> dict[str, Any]:
    """What the gated door measured, for its receipt (the environment holds the versions)."""
    return {k: v for k, v in record.items() if k != "torch"}


def _held(swaps: dict[str, Any]) -> list[str]:
    """What a unit's seats hold, for the arbiter: each module it replaces; a function seat
    replaces no module, only the function its module calls, named `<module>:<structure>`
    (Note [Unit arbitration]: it overlaps no module and no other function); a block seat stands
    for its layer's forward only: its parts are other units' seats, which it requires."""
    return sorted(f"{path}:{seat.seat.form.structure}"
                  if isinstance(seat, (FunctionSeat, BlockSeatModule)) else path
                  for path, seat in swaps.items())


def _measure_unit(model: nn.Module, swaps: dict[str, Any], unit: str, score: Forward,
                  want: torch.Tensor, kind: _core.OutputKind, rounds: int, iters: int,
                  min_speedup: float | None, floors: dict[str, float]) -> dict[str, Any]:
    """One unit (a structure's seats) attached alone: parity against the host, then host and
    unit timed alternately; the core's verdict on it ("verdict": None when the unit could not be
    measured, e.g. a seat that gave its region back mid-rounds: then "decision" says why)."""
    handle = None
    try:
        handle = swap.attach(model, swaps, on_guard_fail="fallback", notes={}, log_line=False,
                             settle_pages=False)
        with torch.no_grad():
            got, _ = output_tensor(score())
        metrics = parity(got, want, kind)
        fallbacks = handle.summary()["fallbacks"]
        host_t, arm_t = [], []
        for _ in range(rounds):
            handle.detach()
            host_t.append(_time(score, iters))
            handle = swap.attach(model, swaps, on_guard_fail="fallback", notes={}, log_line=False,
                                 settle_pages=False)
            arm_t.append(_time(score, iters))
    except ValueError as e:  # a seat returned its region for good: not a candidate
        return {"seats": len(swaps), "parity": {"band": "unmeasured"}, "speedup": 0.0,
                "ratios": [], "decision": f"refused: {e}", "verdict": None}
    finally:
        if handle is not None:
            handle.detach()
    gate = catalog.load(unit).gate
    verdict = _core.judge_unit(catalog.shipped().band(kind), gate,
                               {k: v for k, v in metrics.items() if k != "band"}, fallbacks,
                               host_t, arm_t, min_speedup, floors)
    return {"seats": len(swaps), "parity": metrics, "speedup": verdict.latency.median_ratio,
            "ratios": list(verdict.latency.ratios), "decision": verdict.text,
            "min_speedup": min_speedup if min_speedup is not None else gate.min_speedup,
            "verdict": verdict}


def attach(model: nn.Module, forward: Forward | Iterable[Forward], *,
           structures: Iterable[str] | None = None, scheme: str = "auto",
           output: Forward | None = None, floors: dict[str, float] | None = None,
           min_speedup: float | None = None, rounds: int = 5, iters: int = 3,
           on_guard_fail: str = "fallback") -> FrontDoorResult:
    """min_speedup: None takes each unit's structure's own (catalog gates.latency).

    scheme="auto" measures every scheme of the catalog's gated_auto list on this host and, per
    unit, keeps the fastest whose verdict is activated and whose parity is in the pass band
    (Note [Gated auto] in core/src/gates/gates.cpp); units[unit]["candidates"] holds each one's
    figures. A named scheme is measured alone, its units kept when their verdict is activated.
    Candidates are built one at a time; only each unit's best so far is kept."""
    forwards = normalise_forwards(forward)
    score = output or forwards[-1]
    if model.training:
        raise ValueError("flashrt: the host is in training mode (call model.eval() first)")
    with torch.no_grad():
        ref = score()
        again = score()
    want, kind = output_tensor(ref)
    if not torch.equal(want, output_tensor(again)[0]):
        raise ValueError("flashrt: the unmodified host is not bit-identical across two runs of "
                         "the scored forward; a parity gate would measure noise")
    floors = dict(floors or {})
    gated = list(catalog.shipped().schemes.gated_auto) if scheme == "auto" else []
    graph = observe(model, forwards)
    # A calibrated scheme among the candidates rounds against the observed forwards' inputs;
    # the gated door judges its units on the scored forward, so nothing else is recorded.
    cal = (calibrate(model, forwards, gated or [scheme], source="observed forward")
           if needs_moments(gated or [scheme]) else None)

    tried: dict[str, dict[str, dict[str, Any]]] = {}  # unit -> scheme -> its figures
    held: dict[str, dict[str, Any]] = {}  # unit -> the swaps of its best candidate so far
    arbiter = _core.UnitArbiter(bool(gated))  # the core decides (Note [Unit arbitration])
    plans: dict[str, _core.Plan] = {}  # scheme -> the core's typed plan
    for name in gated or [scheme]:
        plan = plan_observed(model, graph, structures=structures, scheme=name, calibration=cal)
        plans[name] = plan.core
        for path, reason in plan.core.refused:
            arbiter.plan_refused(name, path, reason)
        by_unit: dict[str, dict[str, Any]] = {}
        for path, seat in plan.swaps.items():
            by_unit.setdefault(seat.seat.form.structure, {})[path] = seat
        for unit, swaps in by_unit.items():
            # A block runs its parts' seats: it is measured with them and kept only with them
            # (Note [Unit arbitration]: `needs`).
            parts = {p: s for b in swaps.values() if isinstance(b, BlockSeatModule)
                     for p, s in plan.swaps.items() if any(s is q for q in b.parts.values())}
            t = _measure_unit(model, {**parts, **swaps}, unit, score, want, kind, rounds, iters,
                              min_speedup, floors)
            tried.setdefault(unit, {})[name] = t
            if arbiter.offer(unit, name, t["verdict"], t["decision"], _held(swaps),
                             _held(parts)):
                held[unit] = swaps  # the previous best's packs go with it
        del plan  # a losing candidate's packs go now

    settled = arbiter.settle()
    units: dict[str, dict[str, Any]] = {}
    winners: dict[str, Any] = {}
    chosen: dict[str, str] = {}
    for outcome in settled.units:
        by_scheme = tried[outcome.unit]
        shown_scheme = outcome.best or next(iter(by_scheme))  # a yielding unit shows its best
        shown = {k: v for k, v in by_scheme[shown_scheme].items() if k != "verdict"}
        if gated:
            shown["candidates"] = {n: {k: v for k, v in t.items() if k != "verdict"}
                                   for n, t in by_scheme.items()}
        shown["scheme"] = outcome.best or None
        shown["decision"] = outcome.decision
        units[outcome.unit] = shown
        if outcome.kept:
            winners.update(held[outcome.unit])
            chosen[outcome.unit] = outcome.scheme
    refused: list[tuple[str, str]] = [(site, why) for site, why in settled.refused]

    notes = notes_of(plans[gated[0] if gated else scheme])
    if gated:
        notes["scheme"] = {"name": "auto", "candidates": gated, "chosen": chosen,
                           "formats": {u: plans[n].scheme.formats[u].describe()
                                       if u in plans[n].scheme.formats else None
                                       for u, n in chosen.items()},
                           "keep_host": {p: why for n in gated
                                         for p, why in plans[n].keep_host
                                         if p not in winners}}
    notes["refused"] = refused
    handle = None
    if winners:
        handle = swap.attach(model, winners, on_guard_fail=on_guard_fail, notes=dict(notes))
        with torch.no_grad():
            got, _ = output_tensor(score())
        union = parity(got, want, kind)
        shortfall = _core.floors_shortfall({k: v for k, v in union.items() if k != "band"},
                                           floors)
        units["union"] = {"seats": len(winners), "parity": union, "decision":
                          "activated" if not shortfall else f"refused: {shortfall}"}
        if shortfall:
            handle.detach()
            handle = None
    if handle is None:
        log.warning("[flashrt] 0 seats, %d refused (whole host refused: nothing passed its gates; "
                    "the model is untouched)", len(refused))
    receipt = {"scheme": notes["scheme"], "output_kind": kind.name, "units": units,
               "floors": floors, "min_speedup": min_speedup, "rounds": rounds,
               "torch": torch.__version__}
    if handle is not None:  # handle.receipt() is this door's receipt
        handle.notes.update(door="attach", measurements=_measurements(receipt))
    return FrontDoorResult(handle, units, notes, receipt, host=type(model).__name__)

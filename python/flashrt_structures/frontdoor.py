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
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import nn

from . import _core, catalog, swap
from .autoswap import plan_observed
from .observe import Forward, normalise_forwards, observe

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
    """What attach() returns: the active handle (or none), per-unit figures, and the receipt."""

    handle: swap.AttachHandle | None
    units: dict[str, dict[str, Any]]
    notes: dict[str, Any]
    receipt: dict[str, Any] = field(default_factory=dict)

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


def _measure_unit(model: nn.Module, swaps: dict[str, Any], unit: str, score: Forward,
                  want: torch.Tensor, kind: _core.OutputKind, rounds: int, iters: int,
                  min_speedup: float | None, floors: dict[str, float]) -> dict[str, Any]:
    """One unit (a structure's seats) attached alone: parity against the host, then host and
    unit timed alternately; the core's verdict on it ("verdict": None when the unit could not be
    measured, e.g. a seat that gave its region back mid-rounds: then "decision" says why)."""
    handle = None
    try:
        handle = swap.attach(model, swaps, on_guard_fail="fallback", notes={}, log_line=False)
        with torch.no_grad():
            got, _ = output_tensor(score())
        metrics = parity(got, want, kind)
        fallbacks = handle.summary()["fallbacks"]
        host_t, arm_t = [], []
        for _ in range(rounds):
            handle.detach()
            host_t.append(_time(score, iters))
            handle = swap.attach(model, swaps, on_guard_fail="fallback", notes={}, log_line=False)
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


def _overlaps(path: str, taken: Iterable[str]) -> bool:
    """Whether a module path is, holds or sits inside one already seated."""
    return any(path == t or path.startswith(t + ".") or t.startswith(path + ".") for t in taken)


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

    tried: dict[str, dict[str, dict[str, Any]]] = {}  # unit -> scheme -> its figures
    best: dict[str, tuple[str, Any, dict[str, Any]]] = {}  # unit -> (scheme, verdict, swaps)
    paths: dict[str, set[str]] = {}  # unit -> every module some candidate seats for it
    why_not: dict[str, list[str]] = {}  # module -> each plan's refusal of it
    plan_notes: dict[str, dict[str, Any]] = {}
    for name in gated or [scheme]:
        plan = plan_observed(model, graph, structures=structures, scheme=name)
        plan_notes[name] = plan.notes
        for path, reason in plan.notes["refused"]:
            why_not.setdefault(path, []).append(f"{name}: {reason}" if gated else reason)
        by_unit: dict[str, dict[str, Any]] = {}
        for path, seat in plan.swaps.items():
            by_unit.setdefault(seat.seat.form.structure, {})[path] = seat
        for unit, swaps in by_unit.items():
            paths.setdefault(unit, set()).update(swaps)
            t = _measure_unit(model, swaps, unit, score, want, kind, rounds, iters, min_speedup,
                              floors)
            tried.setdefault(unit, {})[name] = t
            v = t["verdict"]
            if v is None:
                continue
            if gated:  # the faster of the best so far and this one, if either passes
                held = [best[unit][1]] if unit in best else []
                pick = _core.pick_candidate(held + [v])
                if pick == len(held):
                    best[unit] = (name, v, swaps)
            elif v.decision == _core.UnitDecision.activated:
                best[unit] = (name, v, swaps)
        del plan  # a losing candidate's packs go now

    units: dict[str, dict[str, Any]] = {}
    winners: dict[str, Any] = {}
    chosen: dict[str, str] = {}
    refused: list[tuple[str, str]] = []
    for unit, by_scheme in tried.items():
        kept = best.get(unit)
        shown = {k: v for k, v in by_scheme[kept[0] if kept else next(iter(by_scheme))].items()
                 if k != "verdict"}
        if gated:
            shown["candidates"] = {n: {k: v for k, v in t.items() if k != "verdict"}
                                   for n, t in by_scheme.items()}
            if kept is None:
                shown["decision"] = "refused: no candidate passed (" + "; ".join(
                    f"{n}: {t['decision']}, parity {t['parity']['band']}"
                    for n, t in by_scheme.items()) + ")"
        shown["scheme"] = kept[0] if kept else None
        if kept is not None and any(_overlaps(p, winners) for p in kept[2]):
            shown["decision"] = "refused: its modules are seated by another unit"
            kept = None
        units[unit] = shown
        if kept is None:
            refused.extend((p, f"{unit} unit {shown['decision']}") for p in sorted(paths[unit]))
            continue
        winners.update(kept[2])
        chosen[unit] = kept[0]
    seated_or_decided = set(winners) | {p for p, _ in refused}
    refused += [(p, "; ".join(reasons)) for p, reasons in why_not.items()
                if p not in seated_or_decided]

    first = plan_notes[gated[0] if gated else scheme]
    notes = dict(first)
    if gated:
        notes["scheme"] = {"name": "auto", "candidates": gated, "chosen": chosen,
                           "formats": {u: plan_notes[n]["scheme"]["formats"].get(u)
                                       for u, n in chosen.items()},
                           "keep_host": {p: why for n in gated
                                         for p, why in plan_notes[n]["scheme"]["keep_host"].items()
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
    return FrontDoorResult(handle, units, notes, receipt)

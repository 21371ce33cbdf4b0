"""auto_swaps and explain: observe the host, let the core plan, build the seat modules.

Build-only: nothing is judged here (the gated front door is `attach`) and nothing is swapped
until `swap.attach(model, plan.swaps)`."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from . import _core, accuracy, catalog, decisions, seats, swap
from .block_seats import build_block_seat
from .observe import Forward, normalise_forwards, observe
from .observe.calibration import Calibration, needs_moments, record
from .seats import SeatModule

log = logging.getLogger("flashrt")


@dataclass
class AutoPlan:
    swaps: dict[str, SeatModule]
    notes: dict[str, Any]
    seams: list[_core.SeatPlan]
    core: _core.Plan = field(repr=False)

    def attach(self, model: nn.Module, *, on_guard_fail: str = "fallback") -> swap.AttachHandle:
        if not self.swaps:
            raise ValueError("flashrt: no swaps in this plan (every seam kept at host or refused)")
        return swap.attach(model, self.swaps, on_guard_fail=on_guard_fail,
                           notes={**self.notes, "door": "auto_swaps"})


def build_swaps(model: nn.Module, plan: _core.Plan,
                calibration: Calibration | None = None) -> dict[str, SeatModule]:
    """One seat module per planned seat, keyed by the module it stands in for; a packed seat
    has one per projection it replaces. A calibrated form is packed against the calibration's
    moments of each operand's input."""
    out: dict[str, SeatModule] = {}
    blocks = [sp for sp in plan.seats if sp.op == _core.OpKind.block]
    for sp in plan.seats:
        if sp.op == _core.OpKind.block:
            continue  # built from its parts' seats, below
        moments = calibration.operand_moments(sp) if calibration is not None else {}
        out.update(seats.build_pack(model, sp) if len(sp.replaces) > 1
                   else {sp.site: seats.build(model, sp, moments=moments)})
    for sp in blocks:
        out[sp.site] = build_block_seat(model, sp, out)
    return out


def calibrate(model: nn.Module, forwards: list[Forward], schemes: Iterable[str], *,
              source: str) -> Calibration:
    """Runs the forwards once more with the projections' inputs recorded: a few rows each for
    the accuracy bands, and their moments where one of `schemes` asks for them."""
    names = list(schemes)
    policy = catalog.shipped().schemes
    if "auto" in names:
        names += list(policy.auto_order)
    return record(model, forwards, span_cap=needs_moments(names), source=source)


def notes_of(plan: _core.Plan) -> dict[str, Any]:
    """The handle's record of a plan (handle.notes: "refused", "assumed", "kernel_unavailable",
    "scheme"): the one place the typed plan becomes the user-facing dict. The door's own code
    reads the typed plan (AutoPlan.core)."""
    return {
        "refused": [tuple(r) for r in plan.refused],
        "assumed": list(plan.assumed),
        "kernel_unavailable": [{"repo": e.repo, "version": e.version, "error": e.error,
                                "detail": e.detail} for e in plan.kernel_unavailable],
        "scheme": {"name": plan.scheme.name,
                   "keep_host": {site: why for site, why in plan.keep_host},
                   "formats": {s: f.describe() for s, f in plan.scheme.formats.items()}},
    }


def auto_swaps(model: nn.Module, forward: Forward | Iterable[Forward], *,
               structures: Iterable[str] | None = None, scheme: str = "auto",
               min_seat_weights: int | None = None,
               account_weights: int | None = None,
               calibration: Forward | Iterable[Forward] | None = None) -> AutoPlan:
    """Observes one real forward (or several), plans in the core, builds the seat modules.
    structures: catalog names to look for (default: every structure in the catalog).
    account_weights: the size from which the plan names every parameter (default: the
    catalog's keep_host.account_weights; Note [Every weight accounted] in the core).
    calibration: forwards whose projection inputs a calibrated scheme rounds against and every
    seat's accuracy band is measured on (default: the observed forwards, run once more).
    notes["accuracy"] holds each seat's band."""
    forwards = normalise_forwards(forward)
    graph = observe(model, forwards)
    cal = calibrate(model, normalise_forwards(calibration) if calibration is not None
                    else forwards, [scheme],
                    source="calibration set" if calibration is not None else "observed forward")
    return plan_observed(model, graph, structures=structures, scheme=scheme,
                         min_seat_weights=min_seat_weights, account_weights=account_weights,
                         calibration=cal)


def plan_observed(model: nn.Module, graph: _core.HostGraph, *,
                  structures: Iterable[str] | None = None, scheme: str = "auto",
                  min_seat_weights: int | None = None,
                  account_weights: int | None = None,
                  calibration: Calibration | None = None) -> AutoPlan:
    """auto_swaps over a host already observed (one observation, several schemes' plans)."""
    if calibration is not None:
        calibration.write(graph)
    options = _core.PlanOptions()
    options.structures = list(structures or [])
    options.scheme = scheme
    options.min_seat_weights = min_seat_weights
    options.account_weights = account_weights
    options.decisions_path = decisions.path()
    core_plan = _core.plan(graph, catalog.shipped(), options)
    swaps = build_swaps(model, core_plan, calibration)
    notes = notes_of(core_plan)
    if calibration is not None:
        notes["accuracy"] = accuracy.bands(swaps, calibration)
    return AutoPlan(swaps, notes, list(core_plan.seats), core_plan)


def explain(plan: Any, verbose: bool = False) -> str:
    """Every seat, keep-at-host and refusal with its reason, and the counts. Takes an AutoPlan,
    an AdoptionReport, a core Plan, a DecodePlan or a DecodeLoop (whose plan it prints).

    Entries that differ only by one index of their path are written once with the index set and
    their count (``model.layers.{0..29}.mlp  decoder_ffn ... -> ffn_q4_1 (...)  x30``; the core
    groups them, Note [Explain groups]); ``verbose=True`` lists each on its own line."""
    plan = getattr(plan, "plan", plan)  # a DecodeLoop carries its DecodePlan
    if isinstance(plan, _core.DecodePlan):
        return _core.explain_decode(plan, verbose)
    return _core.explain(getattr(plan, "core", plan), verbose)


def list_schemes() -> list[str]:
    return list(_core.scheme_names(catalog.shipped()))

"""auto_swaps and explain: observe the host, let the core plan, build the seat modules.

Build-only: nothing is judged here (the gated front door is `attach`) and nothing is swapped
until `swap.attach(model, plan.swaps)`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterable

from torch import nn

from . import _core, swap
from .observe import Forward, normalise_forwards, observe
from .seats import FfnSeatModule, LinearSeatModule, SeatModule

log = logging.getLogger("flashrt")

DEFAULT_STRUCTURES = ("linear_proj", "decoder_ffn", "lm_head")


@dataclass
class AutoPlan:
    swaps: dict[str, SeatModule]
    notes: dict[str, Any]
    seams: list[_core.SeatPlan]
    core: _core.Plan = field(repr=False)

    def attach(self, model: nn.Module, *, on_guard_fail: str = "fallback") -> swap.AttachHandle:
        if not self.swaps:
            raise ValueError("flashrt: no swaps in this plan (every seam kept at host or refused)")
        return swap.attach(model, self.swaps, on_guard_fail=on_guard_fail, notes=self.notes)


def _linear_seat(site: str, host: nn.Linear, sp: _core.SeatPlan, dtype: str) -> LinearSeatModule:
    f = sp.form
    seat = _core.make_linear_seat(site, sp.seam.structure, sp.impl, sp.package, host.weight,
                                  host.bias, dtype, f.format, f.group, f.symmetric, sp.band_min,
                                  sp.band_max, "fallback")
    return LinearSeatModule(site, host, seat)


def build_swaps(model: nn.Module, plan: _core.Plan) -> dict[str, SeatModule]:
    swaps: dict[str, SeatModule] = {}
    for sp in plan.seats:
        seam = sp.seam
        dtype = seam.act_dtype or seam.weight_dtype
        if seam.structure == "decoder_ffn" and sp.impl.startswith("ffn_as_projections"):
            for slot in ("gate", "up", "down"):
                path = seam.slots[slot]
                swaps[path] = _linear_seat(path, model.get_submodule(path), sp, dtype)
        elif seam.structure == "decoder_ffn":
            host = model.get_submodule(seam.site)
            g, u, d = (model.get_submodule(seam.slots[s]) for s in ("gate", "up", "down"))
            f = sp.form
            seat = _core.make_ffn_seat(seam.site, sp.impl, sp.package, g.weight, u.weight,
                                       d.weight, seam.activation, dtype, f.format, f.group,
                                       f.symmetric, sp.band_min, sp.band_max, "fallback")
            swaps[seam.site] = FfnSeatModule(seam.site, host, seat, seam.in_features)
        else:
            swaps[seam.site] = _linear_seat(seam.site, model.get_submodule(seam.site), sp, dtype)
    return swaps


def notes_of(plan: _core.Plan) -> dict[str, Any]:
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
               structures: Iterable[str] = DEFAULT_STRUCTURES, scheme: str = "auto",
               min_seat_weights: int | None = None) -> AutoPlan:
    """Observes one real forward (or several), plans in the core, builds the seat modules."""
    forwards = normalise_forwards(forward)
    graph = observe(model, forwards)
    options = _core.PlanOptions()
    options.structures = list(structures)
    options.scheme = scheme
    if min_seat_weights is not None:
        options.min_seat_weights = min_seat_weights
    core_plan = _core.plan(graph, options)
    return AutoPlan(build_swaps(model, core_plan), notes_of(core_plan), list(core_plan.seats),
                    core_plan)


def explain(plan: AutoPlan | _core.Plan) -> str:
    """Every seat, keep-at-host and refusal with its reason, and the counts."""
    return _core.explain(plan.core if isinstance(plan, AutoPlan) else plan)


def list_schemes() -> list[str]:
    return list(_core.scheme_names())

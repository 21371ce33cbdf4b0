"""get(name).bind(module, calibration): one seam the user chose, bound and self-checked."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from . import _core
from .autoswap import auto_swaps
from .catalog import list_structures, load
from .seats import SeatModule


class GateRefused(RuntimeError):
    """A bound seam whose self-check fell below the requested gate."""


class StructureHandle:
    def __init__(self, name: str) -> None:
        self.spec = load(name)
        self.name = name

    def bind(self, module: nn.Module, calibration: Sequence[torch.Tensor], *,
             scheme: str = "w8a16_decode", gate_cos: float | None = None) -> SeatModule:
        """Binds `module` as this structure and checks it against the module itself on every
        calibration sample; raises GateRefused when the worst cosine is below gate_cos (default:
        the structure's own parity pass band) and ValueError when the module is not this
        structure (with the planner's reason)."""
        if gate_cos is None:
            gate_cos = self.spec.gate.pass_
        if not calibration:
            raise ValueError("bind: calibration needs at least one sample")
        plan = auto_swaps(module, [functools.partial(module, x) for x in calibration],
                          structures=[self.name], scheme=scheme, min_seat_weights=0)
        bound = plan.swaps.get("")
        if bound is None:
            reasons = [r for _, r in plan.core.refused] + [r for _, r in plan.core.keep_host]
            raise ValueError(f"bind: {type(module).__name__} is not bound as {self.name}: "
                             + ("; ".join(reasons) or "the structure does not describe it"))
        with torch.no_grad():
            cosines = [_core.value_metrics(bound(x).float().contiguous(),
                                           module(x).float().contiguous()).cosine
                       for x in calibration]
        verdict = _core.judge_certification(cosines, gate_cos)  # the core judges
        worst = verdict.worst_cosine
        if not verdict.passed:
            raise GateRefused(f"bind: {self.name} {verdict.text}")
        bound.certification = {"structure": self.name, "version": self.spec.version,
                               "digest": self.spec.digest, "form": bound.seat.form.describe(),
                               "worst_cos": worst, "samples": len(calibration)}
        return bound


def get(name: str) -> StructureHandle:
    if name not in list_structures():
        raise KeyError(f"unknown structure {name!r}; the catalog has {list_structures()}")
    return StructureHandle(name)


def certification(module: Any) -> dict[str, Any] | None:
    return getattr(module, "certification", None)

"""Calibration: what the forwards showed at each projection's input.

Two records per projection (an `nn.Linear`) and per module that holds projections: a few of its
input rows (each seat's accuracy band is measured on them, `accuracy.py`), and, where the scheme
asks for `input_moments`, the core's `InputMoments` of every row (what a calibrated form rounds
against, Note [Calibrated rounding] in core/src/quant/calibrated.cpp). Modules that read the
very same tensor in a forward (q, k and v; gate and up) share one InputMoments, so it is summed
and factorised once. The door converts tensors; the core sums and decides.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import _core, catalog
from .calls import Forward

SAMPLE_ROWS = 64  # rows kept per input for the accuracy bands
SAMPLE_PER_CALL = 16  # at most this many of them from one call, spread over its rows


@dataclass
class Calibration:
    """The record of one set of forwards: where it came from, the moments (empty when no scheme
    asked for them; each holds its own row count) and the sample rows."""

    source: str
    moments: dict[str, _core.InputMoments] = field(default_factory=dict)
    samples: dict[str, torch.Tensor] = field(default_factory=dict)

    def write(self, graph: _core.HostGraph) -> None:
        """Each module's calibration_rows: the rows its moments hold (0 without moments)."""
        modules = list(graph.modules)
        for hm in modules:
            m = self.moments.get(hm.path)
            hm.calibration_rows = m.rows if m is not None else 0
        graph.modules = modules

    def operand_moments(self, plan: _core.SeatPlan) -> dict[str, _core.InputMoments]:
        """The moments of each weight operand's input, for a plan whose form is calibrated."""
        if not plan.form.calibrated:
            return {}
        return {operand: self.moments[slot.module] for operand, slot in plan.slots.items()
                if slot.module in self.moments}

    def sample(self, site: str, slots: Iterable[str]) -> torch.Tensor | None:
        """Rows a seat at `site` reads: the site's own input, else the input of the first of
        `slots` (module paths) recorded."""
        if site in self.samples:
            return self.samples[site]
        return next((self.samples[s] for s in slots if s in self.samples), None)


def needs_moments(schemes: Iterable[str]) -> int:
    """The span cap (> 0) when any of these schemes declares input_moments, else 0."""
    policy = catalog.shipped().schemes
    caps = [policy.schemes[s].calibration_span for s in schemes
            if s in policy.schemes and _core.Statistic.input_moments in
            policy.schemes[s].statistics]
    return max(caps, default=0)


class _Recorder:
    def __init__(self, model: nn.Module, span_cap: int) -> None:
        self.model = model
        self.span_cap = span_cap
        self.record = Calibration(source="")
        self._call_owner: dict[int, tuple[torch.Tensor, _core.InputMoments]] = {}
        self._added: dict[str, int] = {}  # path -> id of the tensor last added for it

    def targets(self) -> list[tuple[str, nn.Module]]:
        """Every Linear, every module with a Linear child (a region's input) and every leaf
        holding a 1-D weight (a norm a seat may stand in for)."""
        out = []
        for path, mod in self.model.named_modules():
            children = list(mod.children())
            weight = getattr(mod, "weight", None)
            if (isinstance(mod, nn.Linear) or any(isinstance(c, nn.Linear) for c in children)
                    or (not children and isinstance(weight, torch.Tensor) and weight.dim() == 1)):
                out.append((path, mod))
        return out

    def on_call(self, path: str, mod: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or not x.is_floating_point():
            return
        rows = x.reshape(-1, x.shape[-1])
        if rows.shape[0] == 0:
            return  # an expert no token was routed to: nothing to record
        self._keep_sample(path, rows)
        if not isinstance(mod, nn.Linear) or self.span_cap <= 0 or mod.in_features % 32:
            return
        moments = self.record.moments.get(path)
        shared = self._call_owner.get(id(x))
        if moments is None:
            if shared is not None:  # another projection read this very tensor: one record
                moments = self.record.moments[path] = shared[1]
            else:
                span = _core.InputMoments.span_for(mod.in_features, 32, self.span_cap)
                moments = self.record.moments[path] = _core.InputMoments(mod.in_features, span)
        if shared is not None and shared[1] is moments:
            return  # already summed for a sibling in this call
        if rows.dtype not in (torch.float32, torch.bfloat16):
            rows = rows.float()
        moments.add(rows if rows.stride(-1) == 1 else rows.contiguous())
        self._call_owner[id(x)] = (x, moments)  # x kept alive: its id is not reused meanwhile

    def _keep_sample(self, path: str, rows: torch.Tensor) -> None:
        have = self.record.samples.get(path)
        if have is not None and have.shape[0] >= SAMPLE_ROWS:
            return
        step = max(1, rows.shape[0] // SAMPLE_PER_CALL)
        picked = rows[::step][:SAMPLE_PER_CALL].detach().clone()
        self.record.samples[path] = (picked if have is None
                                     else torch.cat([have, picked])[:SAMPLE_ROWS])

    def run(self, forwards: list[Forward]) -> None:
        handles = [mod.register_forward_pre_hook(functools.partial(self.on_call, path))
                   for path, mod in self.targets()]
        try:
            with torch.no_grad():
                for fwd in forwards:
                    fwd()
                    self._call_owner.clear()
        finally:
            for h in handles:
                h.remove()


def record(model: nn.Module, forwards: list[Forward], *, span_cap: int,
           source: str) -> Calibration:
    """Runs the forwards with the model's projections observed (`span_cap` > 0: their moments
    too, each input's span at most that wide)."""
    rec = _Recorder(model, span_cap)
    rec.record.source = source
    rec.run(forwards)
    return rec.record

"""Seats on vLLM's own layers: a seat standing for a projection layer, the head seated in its
quant method, and the seat set built from a plan over the held weights."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import _core
from ..engine_door import EngineSeat as EngineSeat
from ..engine_door import HeadHost
from ..seats import SeatModule

# The engine's head lives under this attribute of its causal-LM module; the logits processor
# applies its weight through `lm_head.quant_method.apply` (the module itself is never called).
HEAD_ATTR = "lm_head"


class HeadMethod:
    """Stands in for the head's quant method with another `apply`; everything else is the
    engine's own method (the embedding lookup of a tied head included)."""

    def __init__(self, method: Any, apply: Any) -> None:
        self._frt_method, self.apply = method, apply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._frt_method, name)


def _seated_apply(method: Any, seat: SeatModule):
    def apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None):
        if bias is not None:  # an embedding bias is outside the structure's boundary
            return method.apply(layer, x, bias=bias)
        return seat(x)
    return apply


def build_seats(model: nn.Module, plan: _core.Plan, held: dict[str, dict[str, torch.Tensor]]
                ) -> tuple[dict[str, SeatModule], dict[str, tuple]]:
    """The seats of `plan`, packed from the held tensors: projections as module swaps, the head
    as a placement in its quant method, a fused expert bank as its method's apply
    (`swap.attach(..., placed=...)`)."""
    swaps: dict[str, SeatModule] = {}
    placed: dict[str, tuple] = {}
    from . import banks
    for sp in plan.seats:
        if sp.op == _core.OpKind.moe_ffn:  # a fused expert bank: its method's apply
            bank, place, undo = banks.seat(model, sp, held)
            bank.plan = sp
            placed[sp.site] = (bank, place, undo)
            continue
        tensors = {op: held[s.module][s.tensor] for op, s in sp.slots.items()}
        seat = _core.build_seat(sp, tensors)
        if sp.site == HEAD_ATTR:
            head = getattr(model, HEAD_ATTR)
            method = head.quant_method

            def compute(layer: nn.Module, x: torch.Tensor, method: Any = method) -> torch.Tensor:
                return method.apply(layer, x, bias=None)
            module = SeatModule(sp.site, HeadHost(head, compute).eval(), seat)

            def place(head=head, method=method, module=module) -> None:
                head.quant_method = HeadMethod(method, _seated_apply(method, module))

            def undo(head=head, method=method) -> None:
                head.quant_method = method
            placed[sp.site] = (module, place, undo)
        else:
            module = swaps[sp.site] = EngineSeat(sp.site, model.get_submodule(sp.site), seat)
        module.plan = sp
    return swaps, placed

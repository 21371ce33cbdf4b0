"""Seats on SGLang's own layers: the seat standing for a linear layer (which always returns
`(out, bias)`), the head placed in the model's logits processor, and the seat set built from a
plan over the held weights."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import _core
from ..engine_door import EngineSeat, HeadHost
from ..seats import SeatModule

# The head layer of SGLang's causal-LM modules; its logits come from `logits_processor`'s
# `_compute_lm_head(hidden, lm_head, embedding_bias)` (the layer itself is never called).
HEAD_ATTR = "lm_head"
LOGITS_ATTR = "logits_processor"

# RowParallelLinear's keyword arguments that change nothing at tensor parallel size 1 (the door
# refuses any other): the reduction across ranks and the batch it would be scattered over.
_SINGLE_RANK_KWARGS = ("skip_all_reduce", "forward_batch")


class SglangSeat(EngineSeat):
    """A seat standing for one of SGLang's linear layers: returns what the layer's observed call
    returned, `(out, bias)` (the bias when the layer skips adding it) or the tensor alone. A call
    that hands an output buffer (`output_tensor`) runs the host, counted."""

    def __init__(self, site: str, host: nn.Module, seat: _core.Seat, pair: bool) -> None:
        self.__dict__["_frt_pair"] = pair
        super().__init__(site, host, seat)

    def returns_bias(self) -> bool:
        return bool(self.__dict__["_frt_pair"])

    def forward(self, x: torch.Tensor, *args, **kwargs):  # noqa: D102
        for name in _SINGLE_RANK_KWARGS:
            kwargs.pop(name, None)
        if kwargs.get("output_tensor") is None:
            kwargs.pop("output_tensor", None)
        return super().forward(x, *args, **kwargs)


def head_layer(model: nn.Module) -> nn.Module | None:
    """The head layer, where the model computes logits through a logits processor."""
    layer = getattr(model, HEAD_ATTR, None)
    w = getattr(layer, "weight", None)
    if (not isinstance(layer, nn.Module) or not isinstance(w, torch.Tensor) or w.dim() != 2
            or not callable(getattr(getattr(model, LOGITS_ATTR, None), "_compute_lm_head", None))):
        return None
    return layer


def _own_logits(model: nn.Module):
    """SGLang's own `_compute_lm_head` of the model's logits processor, from its class: what the
    head seat falls back to and what an embedding bias or another layer still runs, whatever is
    placed on the instance."""
    processor = getattr(model, LOGITS_ATTR)
    return type(processor)._compute_lm_head.__get__(processor)


def _head_place(model: nn.Module, head: nn.Module, module: SeatModule) -> tuple[Any, Any]:
    """The head seat placed as the logits processor's `_compute_lm_head` for this head (an
    embedding bias or another layer goes to SGLang's own), and its undo."""
    processor = getattr(model, LOGITS_ATTR)
    original = _own_logits(model)

    def compute(hidden, lm_head, embedding_bias=None, **kwargs):
        if lm_head is head and embedding_bias is None:
            return module(hidden)
        return original(hidden, lm_head, embedding_bias, **kwargs)

    def place() -> None:
        processor._compute_lm_head = compute

    def undo() -> None:
        processor.__dict__.pop("_compute_lm_head", None)
    return place, undo


def host_logits(model: nn.Module):
    """SGLang's own logits from the head layer: `compute(layer, x)`."""
    original = _own_logits(model)
    return lambda layer, x: original(x, layer, None)


def build_seats(model: nn.Module, plan: _core.Plan, held: dict[str, dict[str, torch.Tensor]],
                pairs: dict[str, bool]) -> tuple[dict[str, SeatModule], dict[str, tuple]]:
    """The seats of `plan`, packed from the held tensors: linears as module swaps (returning
    `(out, bias)` where the observed call did: `pairs`), the head as a placement in the logits
    processor (`swap.attach(..., placed=...)`), attention layers placed in the torch-native
    backend (attention.py)."""
    swaps: dict[str, SeatModule] = {}
    placed: dict[str, tuple] = {}
    for sp in plan.seats:
        tensors = {op: held[s.module][s.tensor] for op, s in sp.slots.items()}
        seat = _core.build_seat(sp, tensors)
        module: SeatModule
        if sp.op == _core.OpKind.paged_attention:
            from .attention import PagedAttentionSeat
            module = swaps[sp.site] = PagedAttentionSeat(sp.site, model.get_submodule(sp.site),
                                                         seat)
        elif sp.site == HEAD_ATTR:
            head = getattr(model, HEAD_ATTR)
            module = SeatModule(sp.site, HeadHost(head, host_logits(model)).eval(), seat)
            place, undo = _head_place(model, head, module)
            placed[sp.site] = (module, place, undo)
        else:
            module = swaps[sp.site] = SglangSeat(sp.site, model.get_submodule(sp.site), seat,
                                                 pairs.get(sp.site, True))
        module.plan = sp
    return swaps, placed

"""Attention seats: a module's calls of the host's attention interface, served by a core seat for
decode rows (observe/attention.py says how a call reaches it: Note [Attention routing]); and a
module's own calls of torch's scaled_dot_product_attention over whole sequences (a diffusion
transformer's processor), served by the core's sequence attention (`SequenceAttentionSeat`).

The module keeps everything else: its projections, its q/k norms and rotary, its cache object
(the seat reads the keys and values the cache hands, where they stand) and the mask the model
built. A call the op takes is one query token per sequence whose mask (if any) attends one range
of positions per row (a static cache's causal mask, left padding, a sliding window: the core
reads it, Note [Mask as a range]); a prompt (more query tokens) goes to the host's implementation
as a band dispatch, and any other miss (a mask of another form, dropout, a keyword the op does not
compute) runs the host's implementation with the same arguments, counted with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from . import _core
from .function_seats import FunctionSeat
from .observe import attention as interface
from .observe.functions import push_hooks, running_modules
from .observe.sequence_attention import bind_sdpa, key_mask, sdpa_function, unserved
from .seats import RAN


class AttentionFunctionSeat(FunctionSeat):
    """One module's attention, placed in the attention interface's router."""

    def __init__(self, site: str, host: nn.Module, seat: _core.Seat) -> None:
        super().__init__(site, host, seat, [])
        place = interface.place_of(host)
        if place is None:
            impl = getattr(getattr(host, "config", None), "_attn_implementation", None)
            raise _core.Refused(f"{site}: its configuration names attention implementation "
                                f"{impl!r}; the router stands in for sdpa and eager")
        self._place = place

    def place(self) -> None:
        interface.engage(self._place)
        interface.route(self.host, self._attend)

    def undo(self) -> None:
        interface.unroute(self.host, self._attend)
        interface.release(self._place)

    def claims(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        return False  # not a namespace function: the router calls _attend

    def _attend(self, host: Callable[..., Any], module: nn.Module, q: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor, mask: Any, kwargs: dict[str, Any]) -> Any:
        args = (module, q, k, v, mask)
        if torch.compiler.is_compiling():
            return host(*args, **kwargs)
        seat = cast(_core.AttentionSeat, self._seat)
        if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
            return self._host_call(seat.miss("q, k, v are not [batch, heads, tokens, dim]"),
                                   host, args, kwargs)
        verdict = seat.admit_rows(q.shape[2])  # one query token per sequence: decode rows
        if verdict != RAN:
            return self._host_call(verdict, host, args, kwargs)
        why = "" if mask is None or isinstance(mask, torch.Tensor) else \
            f"a {type(mask).__name__} mask"
        if not why and (extra := interface.call_extras(kwargs)):
            why = "the call passes " + ", ".join(extra)
        if not why and getattr(module.config, "output_attentions", False):
            why = "the attention weights are asked for"
        if not why and module.training and float(kwargs.get("dropout") or 0.0) > 0:
            why = "dropout in training"
        if not why and torch.is_grad_enabled() and q.requires_grad:
            why = "q requires grad (autograd)"
        if why:
            return self._host_call(seat.miss(why), host, args, kwargs)
        b, heads, _, dim = q.shape
        scaling = kwargs.get("scaling")
        softcap = kwargs.get("softcap")
        out = torch.empty((b, 1, heads, dim), dtype=q.dtype)
        # The core reads the mask's attended range per row (Note [Mask as a range]).
        verdict = seat.call(q, k, v, mask, out,
                            float(scaling) if scaling is not None else dim ** -0.5,
                            float(softcap) if softcap is not None else 0.0, module.training)
        if verdict != RAN:
            return self._host_call(verdict, host, args, kwargs)
        return out, None


class SequenceAttentionSeat(FunctionSeat):
    """One module's calls of torch's scaled_dot_product_attention (its processor's), served by
    the core's sequence attention; any other caller of the function runs torch's untouched."""

    def __init__(self, site: str, host: nn.Module, seat: _core.Seat) -> None:
        super().__init__(site, host, seat, [sdpa_function()])

    def place(self) -> None:
        super().place()
        # The host and every container below it go on the running stack, so a call made by a
        # module inside the host (which observation gave to that module) is not the host's.
        inner = [m for m in self.host.modules() if m is not self.host and next(m.children(), None)]
        self._hooks = [h for m in (self.host, *inner) for h in push_hooks(m)]

    def claims(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        stack = running_modules()
        return bool(stack) and stack[-1] is self.host

    def call(self, original: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
        if torch.compiler.is_compiling():
            return original(*args, **kwargs)
        seat = cast(_core.AttentionSeat, self._seat)
        a = bind_sdpa(args, kwargs)
        if a is None:  # torch raises its own error for the call
            return original(*args, **kwargs)
        q, k, v = a["query"], a["key"], a["value"]
        why = ""
        if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
            why = "q, k, v are not [batch, heads, tokens, dim]"
        elif reason := unserved(a):
            why = "the call asks for " + reason
        elif torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            why = "an operand requires grad (autograd)"
        elif q.shape[1] != k.shape[1] and k.shape[1] != 1 and not a["enable_gqa"]:
            # (One kv head broadcasts in torch's call: the op's grouping of all heads.)
            why = (f"{q.shape[1]} query heads over {k.shape[1]} kv heads without enable_gqa "
                   "(torch refuses it)")
        if why:
            return self._host_call(seat.miss(why), original, args, kwargs)
        b, heads, q_len, dim = q.shape
        scale = a["scale"]
        # Written [batch, q_len, heads, dim] in memory, as torch's CPU flash attention writes
        # it: the processor's transpose(1, 2) and reshape to [batch, q_len, heads * dim] are
        # then views.
        out = torch.empty((b, q_len, heads, dim), dtype=q.dtype).transpose(1, 2)
        verdict = seat.call_sequence(q, k, v, key_mask(a["attn_mask"]), out,
                                     float(scale) if scale is not None else dim ** -0.5,
                                     self.host.training)
        if verdict != RAN:
            return self._host_call(verdict, original, args, kwargs)
        return out


def build_attention_seat(model: nn.Module, plan: _core.SeatPlan,
                         seat: _core.Seat) -> FunctionSeat:
    host = model.get_submodule(plan.site)
    if plan.op == _core.OpKind.sequence_attention:
        return SequenceAttentionSeat(plan.site, host, seat)
    return AttentionFunctionSeat(plan.site, host, seat)

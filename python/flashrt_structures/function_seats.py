"""Function seats: the gated delta rule and the causal convolution a module calls, and the rotary
function attention modules call with their model's tables, replaced where they are called (the
module-level functions of their modeling namespace), not the modules themselves.

While a seat is placed, each function it serves is a dispatch in its namespace: a call from a
seated module (Note [Whose call is it] in observe/functions.py) goes to the core seat, which
checks it and runs the kernel or says why not (counted in its ledger, the host's function then
runs with the same arguments); any other caller (an unseated module, another model of the
process) runs the host's function untouched. The module keeps its projections, its cache object
and its state layout. Detaching removes the hooks and, with the namespace's last seat, puts the
very function object back.
"""

from __future__ import annotations

import inspect
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from . import _core
from .observe.functions import CONV_ACTIVATIONS, Function, called_functions, push_hooks
from .observe.functions import running_modules as _running
from .observe.rotary import measure_rotary, rotary_functions, tables_of
from .seats import BAND, RAISE, RAN, RESTORE, GuardRefused, SeatModule

# (id(namespace), name) -> (the host's function, the seats dispatching from it, the dispatch)
_DISPATCH: dict[tuple[int, str],
                tuple[Callable[..., Any], list[FunctionSeat], Callable[..., Any]]] = {}


def _install(fn: Function, seat: FunctionSeat) -> None:
    key = (id(fn.namespace), fn.name)
    if key not in _DISPATCH:
        original = fn.current()
        seats: list[FunctionSeat] = []

        def dispatch(*args: Any, **kwargs: Any) -> Any:
            for s in seats:
                if s.claims(args, kwargs):
                    return s.call(original, args, kwargs)
            return original(*args, **kwargs)

        dispatch._flashrt_original = original  # type: ignore[attr-defined]
        _DISPATCH[key] = (original, seats, dispatch)
        fn.namespace[fn.name] = dispatch
    _DISPATCH[key][1].append(seat)


def _uninstall(fn: Function, seat: FunctionSeat) -> None:
    key = (id(fn.namespace), fn.name)
    if key not in _DISPATCH:
        return
    original, seats, dispatch = _DISPATCH[key]
    if seat in seats:
        seats.remove(seat)
    if not seats:
        # Put back only what the dispatch replaced: a function someone set there since (a user's
        # own attention, say) stays theirs.
        if fn.namespace.get(fn.name) is dispatch:
            fn.namespace[fn.name] = original
        del _DISPATCH[key]


def _binder(fn: Callable[..., Any]) -> Callable[[tuple[Any, ...], dict[str, Any]],
                                                dict[str, Any]]:
    """The function's arguments by name, defaults filled, extra keywords kept by their own
    names: what inspect's bind gives, at a dispatch's cost (~1 us, against ~15)."""
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    positional = [p.name for p in params if p.kind != p.KEYWORD_ONLY]
    defaults = {p.name: p.default for p in params if p.default is not p.empty}

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        out = dict(defaults)
        out.update(zip(positional, args, strict=False))  # fewer args: defaults stand
        out.update(kwargs)
        return out
    return bind


def _signature_readable(fn: Callable[..., Any]) -> bool:
    try:
        inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return True


def _key(fn: Callable[..., Any]) -> tuple[str, str]:
    """A function by its module and name (two modeling files may each define one of a name)."""
    return getattr(fn, "__module__", ""), getattr(fn, "__name__", "")


class FunctionSeat(SeatModule):
    """A seated function: placed by `place()` (its dispatch installed), taken out by `undo()`."""

    def __init__(self, site: str, host: nn.Module, seat: _core.Seat,
                 functions: list[Function]) -> None:
        super().__init__(site, host, seat)
        self.functions = functions
        # By signature; a builtin without one (torch's attention) is bound by its seat.
        self._binders = {_key(f.original()): _binder(f.original()) for f in functions
                         if _signature_readable(f.original())}
        self._hooks: list[Any] = []

    def place(self) -> None:
        for f in self.functions:
            _install(f, self)

    def undo(self) -> None:
        for f in self.functions:
            _uninstall(f, self)
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        # Undone inside the host's forward (a self-detach): its hook that pops will not run.
        stack = _running()
        if self.host in stack:
            stack.remove(self.host)

    def claims(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        raise NotImplementedError

    def call(self, original: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"flashrt: {self.site}: a function seat is called through the "
                           "function it replaces, not as a module")

    def _bind(self, original: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> dict[str, Any]:
        binder = self._binders.get(_key(original))
        return (binder or _binder(original))(args, kwargs)

    def _host_call(self, verdict: int, original: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
        """Any verdict but ran: the host's function with the same arguments (counted)."""
        reason = self._seat.ledger.last_reason
        if verdict == RAISE:
            raise GuardRefused(f"{self.site}: {reason} (seat form: {self._seat.form.describe()})")
        if verdict != BAND and self._seat.first_time(reason):
            warnings.warn(f"flashrt: {self.site} ran the host's function: {reason}",
                          RuntimeWarning, stacklevel=4)
        out = original(*args, **kwargs)
        if verdict == RESTORE:
            warnings.warn(f"flashrt: {self.site} fell back {_core.SELF_DETACH_AFTER} times in a "
                          f"row ({reason}); the host's function is back for good",
                          RuntimeWarning, stacklevel=4)
            if self._on_restore is not None:
                self._on_restore(self)
        return out

    def _unsupported(self, arguments: dict[str, Any]) -> str:
        """A packed-sequence call (cu_seqlens, seq_idx): the op runs one sequence per row."""
        for name in ("cu_seqlens", "seq_idx"):
            if arguments.get(name) is not None:
                return f"{name} given (packed sequences)"
        return ""


class GatedDeltaFunctionSeat(FunctionSeat):
    """The gated delta rule of one module, both forms (chunked and recurrent)."""

    def place(self) -> None:
        super().place()
        self._hooks = push_hooks(self.host)

    def claims(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        stack = _running()
        return bool(stack) and stack[-1] is self.host

    def call(self, original: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
        if torch.compiler.is_compiling():
            return original(*args, **kwargs)
        a = self._bind(original, args, kwargs)
        seat = cast(_core.GatedDeltaSeat, self._seat)
        operands = [a.get(n) for n in ("query", "key", "value", "g", "beta")]
        tensors = [t for t in operands if isinstance(t, torch.Tensor)]
        state = a.get("initial_state")
        why = self._unsupported(a)
        if not why and len(tensors) < len(operands):
            why = "an operand is not a tensor"
        if not why and (state is not None and not isinstance(state, torch.Tensor)):
            why = "initial_state is not a tensor"
        if not why and torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            why = "an operand requires grad (autograd)"
        if not why and (tensors[0].dim() != 4 or tensors[2].dim() != 4):
            why = (f"q {tuple(tensors[0].shape)}, v {tuple(tensors[2].shape)}: expected "
                   "[batch, tokens, heads, dim]")
        if why:
            return self._host_call(seat.miss(why), original, args, kwargs)
        q, k, v, g, beta = tensors
        b, t, _, dk = q.shape
        hv, dv = v.shape[2], v.shape[3]
        out = torch.empty((b, t, hv, dv), dtype=q.dtype)
        final = torch.empty((b, hv, dk, dv), dtype=torch.float32)
        verdict = seat.call(q, k, v, g, beta, state, out, final,
                            bool(a.get("use_qk_l2norm_in_kernel", False)), float(dk) ** -0.5,
                            self.host.training)
        if verdict != RAN:
            return self._host_call(verdict, original, args, kwargs)
        return out, (final if a.get("output_final_state", False) else None)


class ConvFunctionSeat(FunctionSeat):
    """The causal convolution called with one module's weight: the prompt form and the update."""

    def claims(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """A call handed this module's weight as it stands now (the module's [channels, 1,
        taps] squeezed: the same memory, its channels)."""
        w = kwargs.get("weight")
        if w is None:  # positional: (x, weight, ...) or the update's (x, state, weight, ...)
            w = next((t for t in args[1:3] if isinstance(t, torch.Tensor) and t.dim() == 2), None)
        own = cast(torch.Tensor, self.host.weight)
        return (isinstance(w, torch.Tensor) and w.data_ptr() == own.data_ptr()
                and w.shape[0] == own.shape[0])

    def call(self, original: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
        if torch.compiler.is_compiling():
            return original(*args, **kwargs)
        a = self._bind(original, args, kwargs)
        seat = cast(_core.ConvSeat, self._seat)
        x, w, bias = a.get("hidden_states"), a.get("weight"), a.get("bias")
        state = a.get("conv_state")
        act = a.get("activation")
        why = self._unsupported(a)
        if not why and act is not None and act not in CONV_ACTIVATIONS:
            why = f"activation {act!r}; the op applies silu or none"
        if not why and (not isinstance(x, torch.Tensor) or x.dim() != 3):
            why = "hidden_states is not [batch, channels, tokens]"
        if not why and torch.is_grad_enabled() and cast(torch.Tensor, x).requires_grad:
            why = "hidden_states requires grad (autograd)"
        if why or not isinstance(x, torch.Tensor):
            return self._host_call(seat.miss(why), original, args, kwargs)
        b, c, t = x.shape
        # Written channels-last: the module transposes it to [batch, tokens, channels] and splits
        # q, k, v from it, so each head's vector is contiguous for the rule's kernel.
        y = torch.empty((b, t, c), dtype=x.dtype).transpose(1, 2)
        verdict = seat.call(x, w, bias, state, y,
                            CONV_ACTIVATIONS[act] if act is not None else None, self.host.training)
        if verdict != RAN:
            return self._host_call(verdict, original, args, kwargs)
        return y


class RotaryFunctionSeat(FunctionSeat):
    """The rotary function every attention module of a model calls with one rotary module's
    tables (Note [Whose tables are they] in observe/rotary.py): q and k rotated in one call."""

    def __init__(self, site: str, host: nn.Module, seat: _core.Seat,
                 functions: list[Function]) -> None:
        super().__init__(site, host, seat, functions)
        # The cos tables the rotary module returned lately (one per layer type where it computes
        # several a forward: Gemma 3's local and global), held so no other tensor can be given
        # their memory while they are matched against (Note [Whose tables are they]).
        self._tables: deque[torch.Tensor] = deque(maxlen=8)

    def place(self) -> None:
        super().place()
        self._hooks = [self.host.register_forward_hook(self._returned)]

    def undo(self) -> None:
        super().undo()
        self._tables.clear()

    def _returned(self, _module: nn.Module, _args: Any, output: Any) -> None:
        tables = tables_of(output)
        if tables is not None and not torch.compiler.is_compiling():
            self._tables.append(tables[0])

    def claims(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if torch.compiler.is_compiling():  # traced: the host's function (a fake has no storage)
            return False
        cos = args[2] if len(args) > 2 else kwargs.get("cos")
        if not isinstance(cos, torch.Tensor):
            return False
        ptr = cos.data_ptr()
        return any(t.data_ptr() == ptr for t in self._tables)

    def call(self, original: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
        if torch.compiler.is_compiling():
            return original(*args, **kwargs)
        given: list[str] = []  # other arguments given a value: they may change the result
        if len(args) == 4 and not kwargs:  # the hosts' call: (q, k, cos, sin)
            q, k, cos, sin = args
            layout = 1
        else:
            a = self._bind(original, args, kwargs)
            q, k, cos, sin = (a.pop(n, None) for n in ("q", "k", "cos", "sin"))
            layout = a.pop("unsqueeze_dim", 1)
            given = sorted(n for n, v in a.items() if v is not None)
        seat = cast(_core.RotarySeat, self._seat)
        why = ""
        if given:
            why = "the call passes " + ", ".join(given)
        elif layout != 1:
            why = f"unsqueeze_dim {layout}; the op reads q, k as [batch, heads, tokens, dim]"
        elif not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)):
            why = "an operand is not a tensor"
        elif q.dim() != 4 or k.dim() != 4:
            why = f"q {tuple(q.shape)}, k {tuple(k.shape)}: expected [batch, heads, tokens, dim]"
        elif torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, cos, sin)):
            why = "an operand requires grad (autograd)"
        if why:
            return self._host_call(seat.miss(why), original, args, kwargs)
        b, heads, tokens, dim = q.shape
        # Heads head_dim apart per token (the op's layout), the memory order the host's own
        # elementwise result has for q and k read from [batch, tokens, heads, dim] projections.
        q_out = torch.empty((b, tokens, heads, dim), dtype=q.dtype).transpose(1, 2)
        k_out = torch.empty((b, tokens, k.shape[1], dim), dtype=k.dtype).transpose(1, 2)
        verdict = seat.call(q, k, cos, sin, q_out, k_out, self.host.training)
        if verdict != RAN:
            return self._host_call(verdict, original, args, kwargs)
        return q_out, k_out


def build_function_seat(model: nn.Module, plan: _core.SeatPlan, seat: _core.Seat) -> FunctionSeat:
    """The seat module of a function seat: the functions the site's module (or, for a
    convolution, its parent; for a rotary module, every module of the model) calls that the op
    replaces."""
    host = model.get_submodule(plan.site)
    if plan.op == _core.OpKind.rotary:
        # Only functions measured to compute the op's form (a model naming another rotary
        # function beside it keeps that one's calls with the host).
        functions = [f for f in rotary_functions(model)
                     if measure_rotary(f.original())[0] == _core.RotaryForm.half]
        return RotaryFunctionSeat(plan.site, host, seat, functions)
    if plan.op == _core.OpKind.gated_delta:
        functions = [f for f in called_functions(host) if f.kind == "rule"]
        return GatedDeltaFunctionSeat(plan.site, host, seat, functions)
    parent = model.get_submodule(plan.site.rpartition(".")[0]) if "." in plan.site else model
    functions = [f for f in called_functions(parent) if f.is_conv]
    return ConvFunctionSeat(plan.site, host, seat, functions)

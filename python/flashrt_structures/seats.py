"""Seat modules: what stands in the host's tree where a seam was seated.

A seat module holds a core seat (built by the core from the plan and the host's tensors) and the
host module it stands in for. It keeps the host's own parameters and children (the same objects,
under the same names, so `state_dict()` is the host's schema and bytes), runs the core seat on
every call and, on any verdict other than "ran", runs the retained host module with the same
arguments (DESIGN §6). It converts tensors; it decides nothing.
"""

from __future__ import annotations

import atexit
import itertools
import warnings
import weakref
from typing import Callable

import torch
from torch import nn

from . import _core

RAN, BAND, FALLBACK, RESTORE, RAISE = 0, 1, 2, 3, 4

# Note [Seats in a compiled graph]: under torch.compile a seat's call is the custom op
# flashrt::seat(x, seat_id), opaque to dynamo and AOT autograd (its fake kernel gives the output's
# shape and dtype), so a compiled host keeps every seat inside its graph with no break and no
# recompilation per call. The op's kernel runs the whole eager contract at run time (band,
# training mode, owning thread, dtype, the kernel's form check, fallbacks to the host module,
# the ledger, the self-detach after 32 fallbacks). Two checks are made when the graph is traced
# instead: extra forward arguments, and an input that needs autograd (a custom op has no
# backward), both of which trace the host module itself, so they are not in the ledger. A
# compiled graph keeps calling the op after detach(): the op then runs the host module (bit
# identical to the host), since the graph cannot be told its modules changed.
# seat id -> seat module while attached; weak, so a model dropped while attached is freed.
_SEATS: dict[int, "weakref.ref[SeatModule]"] = {}
# seat id -> the host module it stood for, once detached; weak, so a dropped model is freed.
_DETACHED: dict[int, "weakref.ref[nn.Module]"] = {}
_OUT_WIDTH: dict[int, int] = {}
_IDS = itertools.count(1)


def _seat_kernel(x: torch.Tensor, seat_id: int) -> torch.Tensor:
    """flashrt::seat's kernel: the core seat or, on any miss, the host module."""
    ref = _SEATS.get(seat_id)
    seat = ref() if ref is not None else None
    if seat is not None:
        return seat._contract_call(x)
    ref = _DETACHED.get(seat_id)
    host = ref() if ref is not None else None
    if host is None:
        raise RuntimeError(f"flashrt: seat {seat_id} was released; this compiled graph predates "
                           "it (torch._dynamo.reset() and compile again)")
    return host(x)


def _seat_fake(x: torch.Tensor, seat_id: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], _OUT_WIDTH[seat_id]))


# Defined with the low-level registration rather than torch.library.custom_op: the call costs
# ~4 us instead of ~13 us (measured), and a compiled decode step makes one call per seat.
_LIB = torch.library.Library("flashrt", "DEF")
_LIB.define("seat(Tensor x, int seat_id) -> Tensor")
_LIB.impl("seat", _seat_kernel, "CPU")
torch.library.register_fake("flashrt::seat", _seat_fake, lib=_LIB)
seat_op = torch.ops.flashrt.seat


@atexit.register
def _release_all() -> None:
    """Seats still attached at exit go before the extension's own teardown (no leak report)."""
    _SEATS.clear()
    _DETACHED.clear()


class GuardRefused(RuntimeError):
    """An out-of-form call on a seat attached with on_guard_fail="raise"."""


def refusing(what: str) -> Callable:
    """A stand-in for a host method that must not run while seats are attached."""
    def refuse(*_args, **_kwargs):
        raise RuntimeError(f"flashrt: {what} refused while attached; call handle.detach() first")
    return refuse


class SeatModule(nn.Module):
    """A seated region: the core seat, the host module, and the miss path."""

    def __init__(self, site: str, host: nn.Module, seat: _core.Seat) -> None:
        super().__init__()
        object.__setattr__(self, "_host", host)  # retained, not a registered child
        self._seat = seat
        self.site = site
        self._on_restore: Callable[[SeatModule], None] | None = None
        # The host's own parameters and children, same objects and names: state_dict() is the
        # host's, and whoever reads `module.weight` still finds the host's tensor.
        for name, param in host._parameters.items():
            self.register_parameter(name, param)
        for name, child in host.named_children():
            self.add_module(name, child)
        for attr in ("in_features", "out_features"):  # what callers of a projection may read
            if hasattr(host, attr):
                setattr(self, attr, getattr(host, attr))
        form = seat.form
        self.width, self.out_width = form.width, form.out
        self.seat_id = next(_IDS)
        _OUT_WIDTH[self.seat_id] = self.out_width
        self.train(host.training)

    @property
    def seat(self) -> _core.Seat:
        return self._seat

    @property
    def host(self) -> nn.Module:
        return self._host

    def _apply(self, fn, recurse=True):  # .to(), .half(), .cuda() ...
        raise RuntimeError(f"flashrt: device or dtype migration of {self.site} refused while "
                           "attached; call handle.detach() first")

    def _load_from_state_dict(self, *args, **kwargs):
        raise RuntimeError(f"flashrt: load_state_dict into {self.site} refused while attached; "
                           "call handle.detach() first")

    def _miss(self, verdict: int, args: tuple, kwargs: dict | None = None) -> torch.Tensor:
        ledger = self._seat.ledger
        reason = ledger.last_reason
        if verdict == RAISE:
            raise GuardRefused(f"{self.site}: {reason} (seat form: {self._seat.form.describe()})")
        if verdict != BAND and self._seat.first_time(reason):
            warnings.warn(f"flashrt: {self.site} ran the host: {reason}", RuntimeWarning,
                          stacklevel=3)
        out = self._host(*args, **(kwargs or {}))
        if verdict == RESTORE:
            warnings.warn(f"flashrt: {self.site} fell back {_core.SELF_DETACH_AFTER} times in a "
                          f"row ({reason}); the host module is back for good", RuntimeWarning,
                          stacklevel=3)
            if self._on_restore is not None:
                self._on_restore(self)
        return out

    def engaged(self) -> None:
        """Attached: a compiled graph's flashrt::seat op with this id runs this seat."""
        _SEATS[self.seat_id] = weakref.ref(self)
        _DETACHED.pop(self.seat_id, None)

    def released(self) -> None:
        """Detached (or restored): a compiled graph calling it now runs the host module."""
        _SEATS.pop(self.seat_id, None)
        _DETACHED[self.seat_id] = weakref.ref(self._host)

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if torch.compiler.is_compiling():
            # Traced: see Note [Seats in a compiled graph].
            if args or kwargs or not isinstance(x, torch.Tensor) or (
                    x.requires_grad and torch.is_grad_enabled()):
                return self._host(x, *args, **kwargs)
            return seat_op(x, self.seat_id)
        if args or kwargs:
            return self._miss(self._seat.miss("extra forward arguments"), (x, *args), kwargs)
        return self._contract_call(x)

    def _contract_call(self, x: torch.Tensor) -> torch.Tensor:
        """DESIGN §6 for one call: the kernel, or the host with a counted reason."""
        width = self.width
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != width:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            return self._miss(self._seat.miss(f"input {shape} is not [..., {width}]"), (x,))
        rows = x.numel() // width
        verdict = self._seat.admit_rows(rows)
        if verdict != RAN:
            return self._miss(verdict, (x,))
        if x.requires_grad and torch.is_grad_enabled():
            return self._miss(self._seat.miss("input requires grad (autograd)"), (x,))
        try:
            x2 = x.view(rows, width)
        except RuntimeError:
            return self._miss(self._seat.miss(
                f"input {tuple(x.shape)} strides {x.stride()} not viewable as rows without a copy"),
                (x,))
        out = torch.empty((rows, self.out_width), dtype=x.dtype)
        verdict = self._seat.run(x2, out, self.training)
        if verdict == RAN:
            return out.view(*x.shape[:-1], self.out_width)
        return self._miss(verdict, (x,))

    def extra_repr(self) -> str:
        return f"{self._seat.form.describe()}"


def build(model: nn.Module, plan: _core.SeatPlan, on_guard_fail: str = "fallback",
          adopted: dict[str, _core.PackedLinear] | None = None) -> SeatModule:
    """The seat module for one planned seat: the host tensor of each operand, read in place, or
    the checkpoint's own pack of it when adopted (which moves into the seat)."""
    tensors = {}
    for operand, slot in plan.slots.items():
        if adopted and operand in adopted:
            continue
        tensor = getattr(model.get_submodule(slot.module), slot.tensor)
        tensors[operand] = tensor.detach()
    seat = _core.build_seat(plan, tensors, on_guard_fail=on_guard_fail, adopted=adopted or {})
    return SeatModule(plan.site, model.get_submodule(plan.site), seat)

"""Seat modules: what stands in the host's tree where a seam was seated.

A seat module keeps the host's own parameters (the same objects, under the same names, so
`state_dict()` is the host's schema and bytes), runs the core seat on every call and, on any
verdict other than "ran", runs the retained host module with the same arguments (DESIGN §6).
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import nn

from . import _core

RAN, BAND, FALLBACK, RESTORE, RAISE = 0, 1, 2, 3, 4


class GuardRefused(RuntimeError):
    """An out-of-form call on a seat attached with on_guard_fail="raise"."""


def refusing(what: str) -> Callable:
    """A stand-in for a host method that must not run while seats are attached."""
    def refuse(*_args, **_kwargs):
        raise RuntimeError(f"flashrt: {what} refused while attached; call handle.detach() first")
    return refuse


class SeatModule(nn.Module):
    """Common part of every seat: the host module, the core seat, and the miss path."""

    def __init__(self, site: str, host: nn.Module, seat: _core.Seat) -> None:
        super().__init__()
        object.__setattr__(self, "_host", host)  # retained, not a registered child
        self._seat = seat
        self.site = site
        self._on_restore: Callable[[SeatModule], None] | None = None
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

    def _seated_call(self, x: torch.Tensor, width: int, out_features: int) -> torch.Tensor:
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
        out = torch.empty((rows, out_features), dtype=x.dtype)
        verdict = self._seat.run(x2, out, self.training)
        if verdict == RAN:
            return out.view(*x.shape[:-1], out_features)
        return self._miss(verdict, (x,))


class LinearSeatModule(SeatModule):
    """Seats a projection (linear_proj or lm_head): y = x W^T (+ b) with packed W."""

    def __init__(self, site: str, host: nn.Linear, seat: _core.Seat) -> None:
        super().__init__(site, host, seat)
        self.in_features, self.out_features = host.in_features, host.out_features
        self.weight = host.weight  # the host's Parameter object itself
        self.register_parameter("bias", host.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._seated_call(x, self.in_features, self.out_features)

    def extra_repr(self) -> str:
        return f"{self._seat.form.describe()}"


class FfnSeatModule(SeatModule):
    """Seats a gated feed-forward: down(act(gate(x)) * up(x)), fused, with packed weights."""

    def __init__(self, site: str, host: nn.Module, seat: _core.Seat, hidden: int) -> None:
        super().__init__(site, host, seat)
        for name, child in host.named_children():  # same objects, same state_dict keys
            self.add_module(name, child)
        self.hidden = hidden

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if args or kwargs:
            return self._miss(self._seat.miss("extra forward arguments"), (x, *args), kwargs)
        return self._seated_call(x, self.hidden, self.hidden)

    def extra_repr(self) -> str:
        return f"{self._seat.form.describe()}"

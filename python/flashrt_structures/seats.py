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
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from . import _core

if TYPE_CHECKING:
    from .accuracy import ServedBand

# The core's verdicts (seat.h) as the ints the hot path compares (one definition: the binding).
RAN, BAND, FALLBACK, RESTORE, RAISE = (v.value for v in (
    _core.Verdict.ran, _core.Verdict.band, _core.Verdict.fallback, _core.Verdict.restore,
    _core.Verdict.raise_))

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
_SEATS: dict[int, weakref.ref[SeatModule]] = {}
# seat id -> the host module it stood for, once detached; weak, so a dropped model is freed.
_DETACHED: dict[int, weakref.ref[nn.Module]] = {}
_OUT_WIDTH: dict[int, int] = {}
_IDS = itertools.count(1)


def _seat_kernel(x: torch.Tensor, seat_id: int) -> torch.Tensor:
    """flashrt::seat's kernel: the core seat or, on any miss, the host module."""
    ref = _SEATS.get(seat_id)
    seat = ref() if ref is not None else None
    if seat is not None:
        return seat._contract_call(x)
    host_ref = _DETACHED.get(seat_id)
    host = host_ref() if host_ref is not None else None
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

    # The planned seat it was built from (its kernel package, ladder, the modules it computes),
    # where the builder kept it: what a receipt names.
    plan: _core.SeatPlan | None = None
    _host: nn.Module  # set with object.__setattr__: not a registered child
    # An input whose rows are not one view (a head-split column slice of a packed projection's
    # output) is copied into rows rather than handed to the host: true where the copy costs less
    # than the host's own computation (a norm: one pass over what its five ops read five times).
    copies_strided_input = False
    certification: dict[str, Any]  # set by Structure.bind
    # An engine door's accuracy band, measured on the first rows this seat serves (accuracy.py).
    served_band: ServedBand | None = None

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
        if x.dim() <= 4 and x.is_contiguous():  # the core reads the leading dims as rows
            return self._compute(x, x, rows)
        try:
            x2 = x.view(rows, width)
        except RuntimeError:
            if not self.copies_strided_input:
                return self._miss(self._seat.miss(
                    f"input {tuple(x.shape)} strides {x.stride()} not viewable as rows without a "
                    "copy"), (x,))
            x2 = x.reshape(rows, width)
        return self._compute(x, x2, rows)

    def _compute(self, x: torch.Tensor, x2: torch.Tensor, rows: int) -> torch.Tensor:
        """An admitted call: the core seat's run, the host on any other verdict."""
        # The output in x's shape where the core reads it as rows (rank <= 4), else as rows.
        shaped = x.dim() <= 4
        out = torch.empty((*x.shape[:-1], self.out_width) if shaped else (rows, self.out_width),
                          dtype=x.dtype)
        verdict = self._seat.run(x2, out, self.training)
        if verdict == RAN:
            watch = self.served_band
            if watch is not None and watch.result is None:
                watch.add(self, x, out)
            return self._ran(x, out if shaped else out.view(*x.shape[:-1], self.out_width))
        return self._miss(verdict, (x,))

    def _ran(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out

    def extra_repr(self) -> str:
        return f"{self._seat.form.describe()}"


# Note [Packed seats]: a pack (qkv_pack) is one linear over sibling projections' stacked weights,
# but the host's attention code calls the projections one by one and the pack owns no module
# that holds them all. So each projection gets a seat module. The first the host calls (the
# lead) runs the pack: its input quantized once, one GEMM, and its own columns returned; the
# other columns are left for the siblings, keyed by the input tensor itself (a weak reference),
# its version counter (an in-place change since then misses) and the calling thread. A sibling
# called with that very tensor, unchanged, on that thread, takes its columns once (counted as a
# call of its own ledger); any other call (another tensor, a repeated call, a second thread, the
# lead having run the host) runs the sibling's own module and is a counted fallback. Outputs
# are column views of one buffer, as the host's own fused projections (to_qkv(x).chunk(3)) give.
# Under torch.compile a pack's modules trace their host modules. Detach puts the three host
# modules back; nothing of theirs was changed.
class _Pending:
    """What the lead's last call left for its siblings."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.x: weakref.ref[torch.Tensor] | None = None
        self.version, self.thread = -1, 0
        self.outs: dict[str, torch.Tensor] = {}

    def put(self, x: torch.Tensor, outs: dict[str, torch.Tensor]) -> None:
        self.x, self.version, self.thread = weakref.ref(x), x._version, threading.get_ident()
        self.outs = outs

    def take(self, site: str, x: torch.Tensor) -> torch.Tensor | str:
        """The sibling's columns, or why it cannot have them."""
        lead_x = self.x() if self.x is not None else None
        if lead_x is None or lead_x is not x:
            return "called with another tensor than the pack's first projection ran on"
        if x._version != self.version:
            return "its input was changed in place after the pack's first projection ran"
        if threading.get_ident() != self.thread:
            return "called from another thread than the pack's first projection"
        out = self.outs.pop(site, None)
        if out is None:
            return "called again on the input whose columns it already took"
        return out


class PackLead(SeatModule):
    """The pack's first-called projection: runs the stacked GEMM, keeps the siblings' columns."""

    def __init__(self, site: str, host: nn.Module, seat: _core.Seat, members: list[str],
                 pending: _Pending) -> None:
        super().__init__(site, host, seat)
        self._members, self._pending = members, pending
        self._splits = list(seat.form.splits)

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if torch.compiler.is_compiling():  # Note [Packed seats]
            return self._host(x, *args, **kwargs)
        return super().forward(x, *args, **kwargs)

    def _miss(self, verdict: int, args: tuple, kwargs: dict | None = None) -> torch.Tensor:
        self._pending.clear()  # the siblings run their own modules
        return super()._miss(verdict, args, kwargs)

    def _ran(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        parts = out.split(self._splits, dim=-1)
        self._pending.put(x, dict(zip(self._members[1:], parts[1:], strict=False)))
        return parts[0]


class PackMember(SeatModule):
    """A sibling of a pack: hands over its columns of the lead's call, or runs its own module."""

    def __init__(self, site: str, host: nn.Module, seat: _core.Seat, pending: _Pending) -> None:
        super().__init__(site, host, seat)
        self._pending = pending

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if torch.compiler.is_compiling():  # Note [Packed seats]
            return self._host(x, *args, **kwargs)
        return super().forward(x, *args, **kwargs)

    def _compute(self, x: torch.Tensor, x2: torch.Tensor, rows: int) -> torch.Tensor:
        got = self._pending.take(self.site, x)
        if isinstance(got, str):
            return self._miss(self._seat.miss(got), (x,))
        # The form checks and the count; the lead's GEMM already wrote these columns.
        verdict = self._seat.run(x2, got.view(rows, self.out_width), self.training)
        if verdict == RAN:
            return got
        return self._miss(verdict, (x,))


def build_pack(model: nn.Module, plan: _core.SeatPlan) -> dict[str, SeatModule]:
    """The seat modules of a packed seat, one per projection it replaces (Note [Packed seats])."""
    tensors = {operand: getattr(model.get_submodule(slot.module), slot.tensor).detach()
               for operand, slot in plan.slots.items()}
    seat = _core.build_seat(plan, tensors)  # swap.attach sets its guard mode
    members, pending = list(plan.replaces), _Pending()
    out: dict[str, SeatModule] = {
        members[0]: PackLead(members[0], model.get_submodule(members[0]), seat, members, pending)}
    for i, site in enumerate(members[1:], start=1):
        out[site] = PackMember(site, model.get_submodule(site), _core.member_seat(seat, i, site),
                               pending)
    for module in out.values():
        module.plan = plan
    return out


class BankSeat(SeatModule):
    """A seated bank of routed experts: every call brings the router's choice beside the hidden
    rows, (hidden [rows, D], top_k_index [rows, k], top_k_weights [rows, k]) -> [rows, D]."""

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        call = (x, *args)
        if torch.compiler.is_compiling():
            # A compiled graph traces the host's bank (its call carries the routing, which the
            # one-input flashrt::seat op does not take).
            return self._host(*call, **kwargs)
        if (kwargs or len(args) != 2 or not all(isinstance(t, torch.Tensor) for t in call)):
            return self._miss(self._seat.miss(
                "a bank's call is (hidden, top_k_index, top_k_weights)"), call, kwargs)
        index, weights = args
        if x.dim() != 2 or x.shape[-1] != self.width:
            return self._miss(self._seat.miss(
                f"hidden {tuple(x.shape)} is not [rows, {self.width}]"), call)
        verdict = self._seat.admit_rows(x.shape[0])
        if verdict != RAN:
            return self._miss(verdict, call)
        if x.requires_grad and torch.is_grad_enabled():
            return self._miss(self._seat.miss("input requires grad (autograd)"), call)
        if index.dtype != torch.int64:  # the router's own ids, widened (rows x k values)
            index = index.to(torch.int64)
        if weights.dtype not in (torch.float32, torch.bfloat16):
            weights = weights.float()
        out = torch.empty((x.shape[0], self.out_width), dtype=x.dtype)
        verdict = self._seat.run_routed(x, index.contiguous(), weights.contiguous(), out,
                                        self.training)
        if verdict == RAN:
            return out
        return self._miss(verdict, call)


class NormSeatModule(SeatModule):
    """A seated norm: rows of its width, whatever their strides (copied into rows if need be)."""

    copies_strided_input = True


def _operand(model: nn.Module, slot: _core.SlotTensor) -> torch.Tensor:
    """The host tensor a slot names, read in place: a fused bank's part is a view of its slice
    of the second dimension (gate rows, then up rows)."""
    tensor = getattr(model.get_submodule(slot.module), slot.tensor).detach()
    if slot.parts > 1:
        tensor = tensor.chunk(slot.parts, dim=1)[slot.part]
    return tensor


def build(model: nn.Module, plan: _core.SeatPlan,
          adopted: dict[str, _core.PackedLinear] | None = None,
          moments: dict[str, _core.InputMoments] | None = None) -> SeatModule:
    """The seat module for one planned seat: the host tensor of each operand, read in place, or
    the checkpoint's own pack of it when adopted (which moves into the seat); a calibrated form
    packs each operand against `moments` of its input."""
    tensors = {operand: _operand(model, slot) for operand, slot in plan.slots.items()
               if not (adopted and operand in adopted)}
    seat = _core.build_seat(plan, tensors, adopted=adopted or {},
                            moments=moments or {})  # attach sets its guard mode
    module: SeatModule
    if plan.op in (_core.OpKind.attention, _core.OpKind.sequence_attention):
        from .attention_seats import build_attention_seat  # it builds on this module's classes
        module = build_attention_seat(model, plan, seat)
    elif plan.op in (_core.OpKind.gated_delta, _core.OpKind.causal_conv1d, _core.OpKind.rotary):
        from .function_seats import build_function_seat  # it builds on this module's classes
        module = build_function_seat(model, plan, seat)
    else:
        kind = (BankSeat if plan.op == _core.OpKind.moe_ffn else
                NormSeatModule if plan.op == _core.OpKind.rmsnorm else SeatModule)
        module = kind(plan.site, model.get_submodule(plan.site), seat)
    module.plan = plan
    return module

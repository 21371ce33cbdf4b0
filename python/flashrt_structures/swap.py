"""swap.attach: put seat modules into the host's tree, transactionally, and take them out again
bit-exactly. The handle carries the ledger (DESIGN §6)."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from torch import nn

from . import _core, ops
from . import receipt as receipts
from .function_seats import FunctionSeat
from .seats import SeatModule, refusing

log = logging.getLogger("flashrt")

# Hosts a door has fired on and whose handle is still active (see attached()). The handle is held
# weakly too: it holds its host, and a strong value would keep the weak key alive for ever.
_ACTIVE: weakref.WeakKeyDictionary[nn.Module, weakref.ref[AttachHandle]] = (
    weakref.WeakKeyDictionary())


def _active(model: nn.Module) -> AttachHandle | None:
    ref = _ACTIVE.get(model)
    handle = ref() if ref is not None else None
    return handle if handle is not None and handle.active else None


def attached(model: nn.Module) -> bool:
    """True while a flashrt door's handle is active on `model`: the way to tell "never ran"."""
    return _active(model) is not None


def _resolve(root: nn.Module, path: str) -> tuple[nn.Module, str, nn.Module]:
    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    if name not in parent._modules:
        raise ValueError(f"swap: {path!r} is not a submodule of the host")
    return parent, name, cast(nn.Module, parent._modules[name])


@dataclass
class _Record:
    site: str
    parent: nn.Module
    name: str
    original: nn.Module
    seat: SeatModule
    restored: bool = False
    # A seat placed by its own callable rather than in the module tree (an engine's head, reached
    # through its quant method): undo puts the host's object back.
    undo: Callable[[], None] | None = None

    def put_back(self) -> None:
        if self.undo is not None:
            self.undo()
        elif self.parent._modules.get(self.name) is self.seat:
            self.parent._modules[self.name] = self.original


@dataclass
class AttachHandle:
    """What an attach returns: the ledger, summary(), report(), notes, detach()."""

    root: nn.Module
    records: list[_Record]
    notes: dict[str, Any] = field(default_factory=dict)
    active: bool = True
    _patched: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        ledgers = [r.seat.seat.ledger for r in self.records]
        fallbacks = sum(led.fallbacks for led in ledgers)
        return {
            "seams": sum(1 for r in self.records if not r.restored) if self.active else 0,
            "guarded_calls": sum(led.calls for led in ledgers),
            "fallbacks": fallbacks,
            "band_dispatches": sum(led.band_dispatches for led in ledgers),
            "restored": sum(1 for r in self.records if r.restored),
            "refused": len(self.notes.get("refused", [])),
            "clean": fallbacks == 0,
        }

    def report(self) -> list[dict[str, Any]]:
        out = []
        for r in self.records:
            led, form = r.seat.seat.ledger, r.seat.seat.form
            out.append({"site": r.site, "structure": form.structure, "impl": form.impl,
                        "form": form.describe(), "calls": led.calls, "fallbacks": led.fallbacks,
                        "band_dispatches": led.band_dispatches, "last_reason": led.last_reason,
                        "reasons": dict(led.reasons), "restored": r.restored})
        return out

    def receipt(self) -> dict[str, Any]:
        """The plan, the door's measurements, the ledger as it stands now and the environment
        lock, as one JSON-ready dict (docs/receipts.md)."""
        return receipts.of_handle(self)

    def save_receipt(self, directory: str | Path) -> Path:
        """Writes receipt() to `directory`/receipt.json (the folder is created); its path."""
        return receipts.save(self.receipt(), directory)

    def raise_on_fallback(self) -> None:
        bad = [f"{r['site']}: {r['fallbacks']} fallbacks, last: {r['last_reason']}"
               for r in self.report() if r["fallbacks"]]
        if bad:
            raise RuntimeError("flashrt: seats fell back to the host:\n  " + "\n  ".join(bad))

    def _restore_one(self, seat: SeatModule) -> None:
        for r in self.records:
            if r.seat is seat and not r.restored and (
                    r.undo is not None or r.parent._modules.get(r.name) is seat):
                r.put_back()
                r.restored = True
                seat.released()

    def detach(self) -> None:
        """Puts the same original objects back, in reverse order; idempotent."""
        if not self.active:
            return
        for r in reversed(self.records):
            if not r.restored:
                r.put_back()
            r.seat.released()  # a compiled graph that still calls it runs the host
        for attr in ("_apply", "load_state_dict"):
            if attr in self._patched:
                if self._patched[attr] is None:
                    self.root.__dict__.pop(attr, None)
                else:
                    self.root.__dict__[attr] = self._patched[attr]
        self._patched.clear()
        self.active = False
        if _active(self.root) is None and self.root in _ACTIVE:
            del _ACTIVE[self.root]


def attach(root: nn.Module, swaps: dict[str, SeatModule], *, on_guard_fail: str = "fallback",
           allow_training: bool = False, notes: dict[str, Any] | None = None,
           log_line: bool = True, settle_pages: bool = True,
           placed: dict[str, tuple[SeatModule, Callable[[], None], Callable[[], None]]]
           | None = None) -> AttachHandle:
    """Seats `swaps` ({module path: seat module}) in `root`, all or nothing. `placed` holds seats
    that are not modules of the tree ({site: (seat, place, undo)}): `place()` puts the seat where
    the host calls it, `undo()` restores the host's object; detach runs it like any other.
    settle_pages: ask the kernel to move packs left in small pages into huge ones and note where
    the arena's packs lie (a read of /proc/self/smaps: the gated door's trial attaches and an
    engine's mid-serving switch skip it)."""
    mode = _core.guard_mode(on_guard_fail)  # ValueError outside {'fallback', 'raise'}
    if root.training and not allow_training:
        raise ValueError("flashrt: the host is in training mode; seats serve inference "
                         "(call model.eval() first)")
    if _active(root) is not None:
        raise ValueError("flashrt: a handle is already attached to this host; detach it first")
    placed = dict(placed or {})
    # A function seat is not a module of the tree: it places its own dispatch (function_seats).
    for path in [p for p, s in swaps.items() if isinstance(s, FunctionSeat)]:
        fseat = cast(FunctionSeat, swaps[path])
        placed[path] = (fseat, fseat.place, fseat.undo)
    swaps = {p: s for p, s in swaps.items() if p not in placed}
    every = {**swaps, **{site: seat for site, (seat, _, _) in placed.items()}}
    for path, seat in every.items():
        ledger = seat.seat.ledger
        if ledger.restored:  # DESIGN §6: 32 consecutive fallbacks give the region back for good
            raise ValueError(f"flashrt: the seat for {path} gave its region back to the host after "
                             f"{_core.SELF_DETACH_AFTER} consecutive fallbacks "
                             f"(last: {ledger.last_reason}); build a new plan to seat it again")
    resolved = [(path, *_resolve(root, path)) for path in swaps]  # every path before any change
    records: list[_Record] = []
    handle = AttachHandle(root, records, dict(notes or {}))
    try:
        for path, parent, name, original in resolved:
            seat = swaps[path]
            seat.seat.mode = mode
            seat._on_restore = handle._restore_one
            parent._modules[name] = seat
            seat.engaged()
            records.append(_Record(path, parent, name, original, seat))
        for site, (seat, place, undo) in placed.items():
            seat.seat.mode = mode
            seat._on_restore = handle._restore_one
            place()
            seat.engaged()
            records.append(_Record(site, root, "", seat.host, seat, undo=undo))
        for attr, what in (("_apply", "device or dtype migration"),
                           ("load_state_dict", "load_state_dict")):
            handle._patched[attr] = root.__dict__.get(attr)
            root.__dict__[attr] = refusing(what)
    except Exception:
        handle.detach()
        raise
    _ACTIVE[root] = weakref.ref(handle)
    # The seats' packs were taken from the huge-page arena; where the kernel gave them small pages
    # (a process whose memory had fragmented), it is asked to collapse them, and where the arena's
    # packs lie is noted (Note [Weights in huge pages]): a decode step streams them all. The core
    # never raises here; whatever else does, the seats are in place and the handle is returned.
    if every and settle_pages:
        try:
            handle.notes["weight_pages"] = ops.weight_pages(settle=True)
        except Exception as e:  # noqa: BLE001 - noted, not hidden: seating has succeeded
            handle.notes["weight_pages"] = {"known": False, "error": f"{type(e).__name__}: {e}"}
    refused = handle.notes.setdefault("refused", [])
    if log_line:  # the gated door's trial attaches stay quiet; its final one logs
        log.warning("[flashrt] %d seats, %d refused", len(records), len(refused))
    return handle

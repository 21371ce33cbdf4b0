"""What the serving-engine doors (vllm_engine, sglang_engine) share: the seat that stands for an
engine's projection layer, the request's plan options, switching between built seat sets, the
report of one hooked model, and the tree's norms undescribed.

Both engines run the model in a spawned process; each door's hook keeps, in that process, a record
per hooked model (`{"hooked", "pid", "request", "seats", "refused", "error", "sets", "handle",
...}`), and its plugin reads it back through the engine's own RPC."""

from __future__ import annotations

import json
import os
from typing import Any, cast

import torch
from torch import nn

from . import _core, accuracy, decisions, observe, swap
from .seats import SeatModule


class EngineSeat(SeatModule):
    """A seat standing for one of an engine's projection layers: it returns what the layer returns,
    `(out, bias)` when the layer hands its bias back, and answers attribute reads the engine makes
    of its layer (`output_sizes`, `quant_method`, ...) from the host layer."""

    def __init__(self, site: str, host: nn.Module, seat: _core.Seat) -> None:
        super().__init__(site, host, seat)
        self.__dict__["_frt_ready"] = True  # from here on, unknown attributes are the host's

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if not self.__dict__.get("_frt_ready"):
                raise
            return getattr(self.__dict__["_host"], name)

    def _miss(self, verdict: int, args: tuple, kwargs: dict | None = None) -> torch.Tensor:
        return observe._first_tensor(super()._miss(verdict, args, kwargs))  # type: ignore[return-value]

    def returns_bias(self) -> bool:
        """Whether the host layer returns `(out, bias)` (vLLM: its `return_bias` flag)."""
        return bool(getattr(self._host, "return_bias", False))

    def forward(self, x: torch.Tensor, *args, **kwargs):  # noqa: D102
        out = super().forward(x, *args, **kwargs)
        if not self.returns_bias():
            return out
        host = self._host
        return out, (host.bias if getattr(host, "skip_bias_add", False) else None)


class HeadHost(nn.Module):
    """What a head seat falls back to: the engine's own computation of the logits from the head
    layer, `compute(layer, x)`."""

    def __init__(self, layer: nn.Module, compute: Any) -> None:
        super().__init__()
        object.__setattr__(self, "layer", layer)  # not a child: the seat must not re-register it
        object.__setattr__(self, "compute", compute)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.__dict__["compute"](self.layer, x)


def plan_options(request: dict[str, Any], scheme: str) -> _core.PlanOptions:
    """The core's plan options for one scheme of a door's request."""
    options = _core.PlanOptions()
    options.structures = list(request.get("structures") or [])
    options.scheme = scheme
    options.min_seat_weights = request.get("min_seat_weights")
    options.decisions_path = decisions.path()
    return options


def no_norms(graph: _core.HostGraph) -> None:
    """The engines' norms add the residual in the same call, (x, residual) -> (norm(x + residual),
    x + residual): not the form norm_fused seats (a norm of x alone), so an engine door describes
    no module as a norm (its attention is the engine's own backend, no attention interface).
    Applied to the tree and again after the observed calls, which would make a parameter-free
    leaf whose calls measured as a norm one (an attention observed without metadata can return
    an unwritten buffer whose memory happens to match)."""
    modules = list(graph.modules)
    for m in modules:
        if m.kind == _core.ModuleKind.norm:
            m.kind = _core.ModuleKind.module
    graph.modules = modules


def select_set(model: nn.Module, record: dict[str, Any], scheme: str | None,
               log_line: bool = False) -> None:
    """Attaches the seat set built for `scheme` (None: the host alone), detaching the current;
    the load logs the door's line, a switch does not."""
    current = record.get("handle")
    if current is not None:
        current.detach()
        record["handle"] = None
    record.update(seats=0, scheme=scheme)
    if scheme is None:
        return
    plan, swaps, placed, notes = record["sets"][scheme]
    record.update(explain=_core.explain(plan), refused=notes["refused"],
                  keep_host=notes["scheme"]["keep_host"])
    # Built before any served call: each one-tensor seat's band is measured on the first rows it
    # serves (once per seat: a set attached again keeps what its seats measured).
    for seat in [*swaps.values(), *(s for s, _, _ in placed.values())]:
        if (isinstance(seat, EngineSeat) or type(seat) is SeatModule) and seat.served_band is None:
            seat.served_band = accuracy.ServedBand()
    # The load settles the packs' pages; a switch mid-serving does not stall on it.
    record["handle"] = swap.attach(model, swaps, notes=notes, placed=placed, log_line=log_line,
                                   settle_pages=log_line)
    record["seats"] = len(record["handle"].records)


def refuse_all(model: nn.Module, record: dict[str, Any], refused: list[tuple[str, str]],
               why: str, door: str) -> None:
    """Every site stays with the engine, each named with its reason: an attached handle with no
    seat, so the report says what was refused and the ledger is still there."""
    record.update(refused=refused or [("", why)], explain=f"every projection refused: {why}")
    record["handle"] = swap.attach(model, {}, notes={"refused": record["refused"], "door": door})


def report_of(record: dict[str, Any] | None, never_ran: str) -> dict[str, Any]:
    """What a hook did in this process to one model, as plain data (it crosses processes);
    `never_ran` says why when there is no record."""
    if record is None:
        return {"hooked": False, "pid": os.getpid(), "reason": never_ran}
    out = {k: v for k, v in record.items() if k not in ("handle", "sets")}
    out["built"] = sorted(record.get("sets", {}))
    handle = record.get("handle")
    out["active"] = bool(handle is not None and handle.active)
    out["threads"] = torch.get_num_threads()
    if handle is not None:
        out["seat_bytes"] = sum(r.seat.seat.nbytes for r in handle.records if not r.restored)
        out["summary"] = handle.summary()
        out["seats_report"] = handle.report()
        out["seats"] = out["summary"]["seams"]
        # The bands measured so far on served rows: the report's and the receipt's.
        out["accuracy"] = handle.notes["accuracy"] = accuracy.served_bands(handle.records)
        out["receipt"] = handle.receipt()
    out["refused"] = [list(r) for r in out.get("refused", [])]
    return out


def head_module(path: str, layer: nn.Module) -> _core.HostModule:
    """The engine's head as the core sees it, named by the attribute the logits computation
    reads: a tied head is the embedding module itself, so the head and the lookup are two sites
    over one weight."""
    w = cast(torch.Tensor, layer.weight)
    hm = _core.HostModule()
    hm.path, hm.type_name, hm.kind = path, type(layer).__name__, _core.ModuleKind.linear
    hm.out_features, hm.in_features = w.shape
    hm.weight_dtype = observe.dtype_of(w.dtype)
    hm.weight_device = w.device.type
    hm.weight_id = w.data_ptr()
    return hm


def check_request(scheme: str, structures: list[str] | None, min_seat_weights: int | None,
                  alternates: list[str] | None) -> dict[str, Any]:
    """A door's request, its names checked against the shipped catalog (ValueError for an
    unknown scheme, KeyError listing the known structures)."""
    from . import catalog
    known = set(_core.scheme_names(catalog.shipped())) | {"auto"}
    for name in [scheme, *(alternates or [])]:
        if name not in known:
            raise ValueError(f"flashrt: unknown scheme {name!r} "
                             f"(known: {', '.join(sorted(known))})")
    for name in structures or []:
        catalog.load(name)
    return {"scheme": scheme, "structures": list(structures or []),
            "min_seat_weights": min_seat_weights, "alternates": list(alternates or [])}


def select_built(model: nn.Module | None, record: dict[str, Any] | None,
                 scheme: str | None, alternates_arg: str) -> None:
    """The engine's `select`: attaches a built seat set, or raises naming the sets built."""
    if (model is None or record is None
            or (scheme is not None and scheme not in record.get("sets", {}))):
        built = sorted(record.get("sets", {})) if record else []
        raise ValueError(f"flashrt: no seat set {scheme!r} was built in this engine "
                         f"(built: {built}; {alternates_arg})")
    select_set(model, record, scheme)


def plugin_registered(group: str, name: str, allow_var: str, allows: Any) -> str:
    """"" when the engine will load this package's plugin `name` of entry-point `group` in its
    processes; otherwise why not. `allows(value)`: whether the engine, with its allow list
    `allow_var` set to `value`, loads `name` (each engine parses its list its own way)."""
    from importlib.metadata import entry_points
    if not [ep for ep in entry_points(group=group) if ep.name == name]:
        return (f"the {group} entry point {name!r} is not installed (install "
                "flashrt-structures into this environment with pip, not by path)")
    allowed = os.environ.get(allow_var)
    if allowed is not None and not allows(allowed):
        return f"{allow_var}={allowed!r} does not include {name!r}"
    return ""


def detach_all(records: Any) -> None:
    """At interpreter exit: the engines keep their models until then, so their seats go first,
    before the extension's own teardown."""
    for record in list(records.values()):
        handle = record.pop("handle", None)
        if handle is not None:
            handle.detach()
    records.clear()


def request_in(env: str) -> dict[str, Any] | None:
    """The request a door's install left in the environment variable `env`, or None."""
    raw = os.environ.get(env)
    return json.loads(raw) if raw else None


def plan_sets(graph: _core.HostGraph, request: dict[str, Any], outside: list[tuple[str, str]],
              door: str, build: Any) -> dict[str, tuple]:
    """One plan per scheme of the request (its scheme, then its alternates), each with its seats
    (`build(plan) -> (swaps, placed)`) and notes; the door's own refusals (`outside`, sites it
    named before planning) replace the plan's account of the same sites. Keyed by the scheme the
    plan resolved to ("auto" names one)."""
    from . import catalog
    from .autoswap import notes_of
    named = {site for site, _ in outside}
    sets: dict[str, tuple] = {}
    for scheme in [request.get("scheme", "auto")] + list(request.get("alternates") or []):
        plan = _core.plan(graph, catalog.shipped(), plan_options(request, scheme))
        notes = notes_of(plan)
        notes["refused"] = [r for r in notes["refused"] if r[0] not in named] + outside
        notes["door"] = door
        sets.setdefault(notes["scheme"]["name"], (plan, *build(plan), notes))
    return sets

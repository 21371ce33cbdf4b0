"""The vLLM door: seats on vLLM's own layers, installed where the engine loads its model.

vLLM runs the model in its engine core, by default a spawned child process that re-imports vLLM
and knows nothing of what the parent patched. The door therefore travels two ways:

* `install_load_hook()` (parent, before `LLM(...)`) writes the request to the environment
  (`FLASHRT_VLLM`, inherited by the child) and patches this process too (the in-process engine,
  `VLLM_ENABLE_V1_MULTIPROCESSING=0`);
* the `vllm.general_plugins` entry point `flashrt` (pyproject.toml), which vLLM loads in every one
  of its processes, runs `_plugin()`: it patches the loader only where the request is in the
  environment, and always gives vLLM's workers a read-only `flashrt_report` method, so the parent
  can ask the process that runs the model what happened (`report(llm)`, `attached(llm)`), through
  vLLM's own `collective_rpc`.

Note [The window on CPU]: vLLM's loader calls `process_weights_after_loading` once the checkpoint
is in; on CPU `UnquantizedLinearMethod` then hands each projection's weight to oneDNN (or its own
packed GEMM) and leaves `layer.weight` empty. The hook wraps that call: before it, the tree is
described and each projection's weight is held by reference (no copy); after it, the host is
complete, one real forward (one token, the engine's profiling form: no attention metadata) and one
`compute_logits` are observed, the core plans, seats are packed from the held weights, which are
then let go, and the seats are attached. Prefill (rows beyond the band) runs vLLM's own oneDNN path.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import traceback
import weakref
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from . import _core, catalog, observe, swap
from . import receipt as receipts
from .autoswap import notes_of
from .seats import SeatModule

log = logging.getLogger("flashrt")

ENV = "FLASHRT_VLLM"
PLUGIN = "flashrt"
PLUGIN_GROUP = "vllm.general_plugins"
# The engine's head lives under this attribute of its causal-LM module; the logits processor
# applies its weight through `lm_head.quant_method.apply` (the module itself is never called).
HEAD_ATTR = "lm_head"

# model -> what the hook did to it, in the process that runs the model.
_DONE: weakref.WeakKeyDictionary[nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()
_PATCHED: dict[str, Any] = {}
# Engines that were running, unhooked, when a hook was installed with allow_started=True.
_ACCEPTED: weakref.WeakSet[Any] = weakref.WeakSet()


# ---------------------------------------------------------------- seats on vLLM's layers


class EngineSeat(SeatModule):
    """A seat standing for one of vLLM's projection layers: it returns what the layer returns,
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
        return cast(torch.Tensor, observe._first_tensor(super()._miss(verdict, args, kwargs)))

    def forward(self, x: torch.Tensor, *args, **kwargs):  # noqa: D102
        out = super().forward(x, *args, **kwargs)
        host = self._host
        if not getattr(host, "return_bias", False):
            return out
        return out, (host.bias if getattr(host, "skip_bias_add", False) else None)


class _HeadHost(nn.Module):
    """What the head seat falls back to: the engine's own head method on the head layer."""

    def __init__(self, layer: nn.Module, method: Any) -> None:
        super().__init__()
        object.__setattr__(self, "layer", layer)  # not a child: the seat must not re-register it
        self.method = method

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self.layer, x, bias=None)


class _HeadMethod:
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


# ---------------------------------------------------------------- the hook in the model's process


def _request() -> dict[str, Any] | None:
    raw = os.environ.get(ENV)
    return json.loads(raw) if raw else None


def _whole_engine_refusal(model: nn.Module, model_config: Any) -> str:
    """Why no seat may stand in this engine at all, or ""."""
    try:
        from vllm.distributed import get_tensor_model_parallel_world_size
        tp = get_tensor_model_parallel_world_size()
    except Exception:  # noqa: BLE001 - no parallel state: a single process
        tp = 1
    if tp > 1:
        return (f"tensor parallel size {tp}: each process holds a shard of every projection and "
                "vLLM reduces across processes; the seats take whole projections (tp = 1)")
    quant = getattr(model_config, "quantization", None)
    if quant:
        return (f"quantized checkpoint ({quant}): its projections hold weights in the checkpoint's "
                "own form; adopting them (adopt_prequantized) is not built")
    return ""


def _looks_up(method: Any) -> bool:
    """Whether a layer's method implements token lookups (vLLM's base method only declares it)."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
    return type(method).embedding is not QuantizeMethodBase.embedding


def _head(model: nn.Module) -> nn.Module | None:
    head = getattr(model, HEAD_ATTR, None)
    return head if isinstance(head, nn.Module) and observe.engine_projection(head) else None


def _describe(model: nn.Module) -> tuple[_core.HostGraph, list, dict[str, dict[str, torch.Tensor]]]:
    """Before the engine takes the weights: the tree, the modules to observe, and each
    projection's tensors held by reference."""
    graph, hooked = observe.describe_tree(model)
    held: dict[str, dict[str, torch.Tensor]] = {}
    for path, mod in model.named_modules():
        if observe.engine_projection(mod):
            held[path] = {n: t.detach() for n, t in mod._parameters.items() if t is not None}
    head: Any = _head(model)  # an engine layer: its weight and quant_method are its own
    if head is not None:
        # A tied head is the embedding module itself: named here by the attribute the logits
        # processor reads, so the head and the lookup are two sites over one weight.
        modules = [m for m in graph.modules if m.path != HEAD_ATTR]
        hm = _core.HostModule()
        hm.path, hm.type_name, hm.kind = HEAD_ATTR, type(head).__name__, _core.ModuleKind.linear
        hm.out_features, hm.in_features = head.weight.shape
        hm.weight_dtype = observe.dtype_of(head.weight.dtype)
        hm.weight_device = head.weight.device.type
        hm.weight_id = head.weight.data_ptr()
        graph.modules = modules + [hm]
        graph.output_head = HEAD_ATTR
        held[HEAD_ATTR] = {"weight": head.weight.detach()}
    return graph, hooked, held


def _observe(model: nn.Module, graph: _core.HostGraph, hooked: list) -> None:
    """One decode-shaped forward through the finished host (the engine's profiling form: no
    attention metadata) and one logits computation, observed."""
    from vllm.config import get_current_vllm_config
    from vllm.forward_context import set_forward_context

    head: Any = _head(model)  # an engine layer: its weight and quant_method are its own
    head_calls: list[_core.HostCall] = []
    keep: list[torch.Tensor] = []

    def forward() -> None:
        ids = torch.zeros(1, dtype=torch.long)
        pos = torch.zeros(1, dtype=torch.long)
        with set_forward_context(None, get_current_vllm_config()):
            hidden = model(ids, pos)
        if head is None or not hasattr(model, "compute_logits"):
            return
        method = head.quant_method

        def apply(layer, x, bias=None):
            out = method.apply(layer, x, bias=bias)
            keep.extend((x, out))
            head_calls.append(observe.host_call(HEAD_ATTR, x, out))
            return out
        head.quant_method = _HeadMethod(method, apply)
        try:
            cast(Any, model).compute_logits(hidden)
        finally:
            head.quant_method = method

    observe.record_calls(graph, hooked, [forward])
    graph.calls = list(graph.calls) + head_calls
    keep.clear()
    # A module whose observed calls take token ids is a lookup, not a projection.
    lookups = {c.path for c in graph.calls if c.dtype == _core.DType.other}
    modules = list(graph.modules)
    for m in modules:
        if m.path in lookups and m.kind == _core.ModuleKind.linear:
            m.kind = _core.ModuleKind.embedding
            graph.input_embedding = graph.input_embedding or m.path
    graph.modules = modules
    graph.calls = [c for c in graph.calls if c.path not in lookups]


def _build(model: nn.Module, plan: _core.Plan, held: dict[str, dict[str, torch.Tensor]]
           ) -> tuple[dict[str, SeatModule], dict[str, tuple]]:
    swaps: dict[str, SeatModule] = {}
    placed: dict[str, tuple] = {}
    for sp in plan.seats:
        tensors = {op: held[s.module][s.tensor] for op, s in sp.slots.items()}
        seat = _core.build_seat(sp, tensors)
        if sp.site == HEAD_ATTR:
            head = getattr(model, HEAD_ATTR)
            method = head.quant_method
            module = SeatModule(sp.site, _HeadHost(head, method).eval(), seat)

            def place(head=head, method=method, module=module) -> None:
                head.quant_method = _HeadMethod(method, _seated_apply(method, module))

            def undo(head=head, method=method) -> None:
                head.quant_method = method
            placed[sp.site] = (module, place, undo)
        else:
            module = swaps[sp.site] = EngineSeat(sp.site, model.get_submodule(sp.site), seat)
        module.plan = sp
    return swaps, placed


def _options(request: dict[str, Any], scheme: str) -> _core.PlanOptions:
    options = _core.PlanOptions()
    options.structures = list(request.get("structures") or [])
    options.scheme = scheme
    options.min_seat_weights = request.get("min_seat_weights")
    return options


def _undescribed(model: nn.Module) -> list[tuple[str, str]]:
    """The engine's weight-holding layers that are not projections (read before the engine
    repacks anything): no catalog structure describes them, so they stay with vLLM, each named
    with its tensors' shapes."""
    out = []
    for path, mod in model.named_modules():
        params = {n: t for n, t in mod._parameters.items() if t is not None}
        if (getattr(mod, "quant_method", None) is None or not params
                or observe.engine_projection(mod)):
            continue
        shapes = ", ".join(f"{n} {list(t.shape)} {str(t.dtype).replace('torch.', '')}"
                           for n, t in params.items())
        out.append((path, f"{type(mod).__name__} holds {shapes}: no structure in the catalog "
                          "describes this layer"))
    return out


def _select(model: nn.Module, record: dict[str, Any], scheme: str | None,
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
    record["handle"] = swap.attach(model, swaps, notes=notes, placed=placed, log_line=log_line)
    record["seats"] = len(record["handle"].records)


def _hooked_load(original):
    def process_weights_after_loading(model: nn.Module, model_config: Any, target_device: Any):
        request = _request()
        if request is None or model in _DONE:
            return original(model, model_config, target_device)
        record: dict[str, Any] = {"hooked": True, "pid": os.getpid(), "request": request,
                                  "seats": 0, "refused": [], "error": ""}
        _DONE[model] = record
        held, sites = None, []
        try:
            why = _whole_engine_refusal(model, model_config)
            # The sites such a refusal names, read before the engine repacks the weights: layers
            # whose method applies a 2-D weight, in whatever form (one whose method implements
            # lookups is the embedding), and the head.
            sites = [p for p, m in model.named_modules()
                     if callable(getattr(getattr(m, "quant_method", None), "apply", None))
                     and not _looks_up(m.quant_method)
                     and any(t is not None and t.dim() == 2 for t in m._parameters.values())]
            sites += [HEAD_ATTR] if _head(model) is not None else []
            if not why:
                graph, hooked, held = _describe(model)
                outside = _undescribed(model)
        except Exception as e:  # noqa: BLE001 - the hook never stops the engine
            why = f"observation failed: {type(e).__name__}: {e}"
        original(model, model_config, target_device)
        try:
            model.eval()
            if why:
                refused = [(p, why) for p in sites] or [("", why)]
                record.update(refused=refused, explain=f"every projection refused: {why}")
                record["handle"] = swap.attach(model, {}, notes={"refused": refused,
                                                                 "door": "vllm_engine"})
                return
            _observe(model, graph, hooked)
            assert held is not None  # described above: nothing refused the whole engine
            sets: dict[str, tuple] = {}
            for scheme in [request.get("scheme", "auto")] + list(request.get("alternates") or []):
                plan = _core.plan(graph, catalog.shipped(), _options(request, scheme))
                notes = notes_of(plan)
                notes["refused"] = notes["refused"] + outside
                notes["door"] = "vllm_engine"
                sets.setdefault(notes["scheme"]["name"], (plan, *_build(model, plan, held), notes))
            held = None  # the seats hold their packed weights; the host's go with the engine's
            record["sets"] = sets
            _select(model, record, next(iter(sets)), log_line=True)
        except Exception as e:  # noqa: BLE001 - the hook never stops the engine
            record["error"] = f"{type(e).__name__}: {e}"
            record["handle"] = None
            log.error("[flashrt] hook failed, host runs unmodified: %s\n%s", record["error"],
                      traceback.format_exc())
        finally:
            held = None

    process_weights_after_loading._frt_original = original  # type: ignore[attr-defined]
    return process_weights_after_loading


def _patch_loader() -> None:
    """Wraps the loader's post-processing call, once per process."""
    if "loader" in _PATCHED:
        return
    from vllm.model_executor.model_loader import base_loader
    original = base_loader.process_weights_after_loading
    base_loader.process_weights_after_loading = _hooked_load(original)
    _PATCHED["loader"] = original


def _report_of(model: nn.Module | None) -> dict[str, Any]:
    """What the hook did in this process to `model`, as plain data (it crosses processes)."""
    record = _DONE.get(model) if model is not None else None
    if record is None:
        why = ("the hook was not asked for in this process (install_load_hook() was called after "
               "this engine started, or not at all)" if _request() is None else
               "the hook is installed here but did not see this model load")
        return {"hooked": False, "pid": os.getpid(), "reason": why}
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
        out["receipt"] = handle.receipt()
    out["refused"] = [list(r) for r in out.get("refused", [])]
    return out


@atexit.register
def _detach_all() -> None:
    """Engines keep their model until the interpreter ends: their seats go first, before the
    extension's own teardown."""
    for record in list(_DONE.values()):
        handle = record.pop("handle", None)
        if handle is not None:
            handle.detach()
    _DONE.clear()


def _worker_report(worker: Any) -> dict[str, Any]:
    runner = getattr(worker, "model_runner", None)
    return _report_of(getattr(runner, "model", None))


def _worker_select(worker: Any, scheme: str | None) -> dict[str, Any]:
    runner = getattr(worker, "model_runner", None)
    model = getattr(runner, "model", None)
    record = _DONE.get(model) if model is not None else None
    if (model is None or record is None
            or (scheme is not None and scheme not in record.get("sets", {}))):
        built = sorted(record.get("sets", {})) if record else []
        raise ValueError(f"flashrt: no seat set {scheme!r} was built in this engine "
                         f"(built: {built}; install_load_hook(alternates=...))")
    _select(model, record, scheme)
    return _report_of(model)


def _plugin() -> None:
    """vLLM's `vllm.general_plugins` entry point, run in every vLLM process: acts only when the
    parent asked (the request is in the environment)."""
    try:
        from vllm.v1.worker.worker_base import WorkerBase
        WorkerBase.flashrt_report = _worker_report  # what the hook did here
        WorkerBase.flashrt_select = _worker_select  # A/B: switch between built seat sets
    except Exception as e:  # noqa: BLE001 - a plugin never stops vLLM
        log.error("[flashrt] plugin could not reach vLLM's worker: %s", e)
    if _request() is not None:
        _patch_loader()


# ---------------------------------------------------------------- the door in the user's process


def _plugin_registered() -> str:
    """"" when vLLM will load this package's plugin in its processes; otherwise why not."""
    from importlib.metadata import entry_points
    found = [ep for ep in entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN]
    if not found:
        return (f"the {PLUGIN_GROUP} entry point {PLUGIN!r} is not installed (install "
                "flashrt-structures into this environment with pip, not by path)")
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN not in allowed.split(","):
        return f"VLLM_PLUGINS={allowed!r} does not include {PLUGIN!r}"
    return ""


def _multiprocess() -> bool:
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") not in ("0", "false", "False")


def _live_engines() -> list[Any]:
    mod = sys.modules.get("vllm.v1.engine.llm_engine")
    if mod is None:
        return []
    import gc

    def running(engine: Any) -> bool:  # a shut-down client's finalizer has run
        finalizer = getattr(getattr(engine, "engine_core", None), "_finalizer", None)
        return getattr(finalizer, "alive", True)
    return [o for o in gc.get_objects() if isinstance(o, mod.LLMEngine) and running(o)]


def install_load_hook(scheme: str = "auto", structures: list[str] | None = None, *,
                      min_seat_weights: int | None = None, alternates: list[str] | None = None,
                      allow_started: bool = False) -> dict[str, Any]:
    """Asks every vLLM engine built from now on, in this process or in its engine core, to seat
    its model: after the weights load and before vLLM's CPU path takes them (Note [The window on
    CPU]), the hook observes the model, plans in the core and attaches seats, and logs
    `[flashrt] N seats, M refused` where the model runs. Returns the request. Idempotent.
    alternates: further schemes whose seats are built too and held detached, for paired A/B runs
    in one engine (`select(llm, scheme)`; None is the host alone).

    Refused (RuntimeError), never silent, where the hook could not reach the process that runs
    the model: the plugin is missing or disabled while the engine core is a separate process; an
    engine already runs in this process (its core started without the request; pass
    allow_started=True to hook only the engines built from now on)."""
    known = set(_core.scheme_names(catalog.shipped())) | {"auto"}
    for name in [scheme, *(alternates or [])]:
        if name not in known:
            raise ValueError(f"flashrt: unknown scheme {name!r} "
                             f"(known: {', '.join(sorted(known))})")
    for name in structures or []:
        catalog.load(name)  # KeyError listing the known names
    if _multiprocess() and (why := _plugin_registered()):
        raise RuntimeError(
            "flashrt: refused: vLLM's engine core runs in a spawned process that this hook "
            f"cannot reach: {why}. Install the package (its plugin is loaded in every vLLM "
            "process), or run the engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    request = {"scheme": scheme, "structures": list(structures or []),
               "min_seat_weights": min_seat_weights, "alternates": list(alternates or [])}
    if _request() is None:
        # Engines running now loaded their model without a request: the hook cannot reach them.
        live = [e for e in _live_engines() if e not in _ACCEPTED]
        if live and not allow_started:
            raise RuntimeError(
                f"flashrt: refused: {len(live)} vLLM engine(s) already run in this process; "
                "their model was loaded without the hook and stays unseated. Call "
                "install_load_hook() before LLM(...), or pass allow_started=True to hook only "
                "engines built from now on")
        _ACCEPTED.update(live)
    os.environ[ENV] = json.dumps(request)
    _patch_loader()
    return request


def uninstall_load_hook() -> None:
    """Engines built from now on load unseated (attached engines keep their seats)."""
    os.environ.pop(ENV, None)


def report(llm: Any) -> list[dict[str, Any]]:
    """What the hook did, from each process that runs `llm`'s model (one entry per worker):
    `hooked`, `seats`, `refused` [(site, reason)], `summary` (calls, band dispatches,
    fallbacks, ...), `seats_report` (per seat), `explain`, `receipt` (that process's receipt:
    receipt(llm) gathers them), or `reason` when it never ran."""
    try:
        return list(llm.collective_rpc("flashrt_report"))
    except NotImplementedError:
        return [{"hooked": False, "reason": "the engine's process did not load the flashrt plugin "
                 f"({_plugin_registered() or 'it was installed after the engine started'})"}]


def receipt(llm: Any) -> dict[str, Any]:
    """The receipt of `llm`'s seats (docs/receipts.md): the plan and the ledger of the process
    that runs its model (its first worker; `workers` holds each one's), and that process's
    environment lock. A worker where the hook never ran is listed with its reason."""
    return receipts.of_workers(report(llm))


def save_receipt(llm: Any, directory: str | Path) -> Path:
    """Writes receipt(llm) to `directory`/receipt.json (the folder is created); its path."""
    return receipts.save(receipt(llm), directory)


def select(llm: Any, scheme: str | None) -> list[dict[str, Any]]:
    """Switches every worker of `llm` to the seat set built for `scheme` (its main scheme or one
    of the alternates), or to the host alone (None); returns the reports."""
    return list(llm.collective_rpc("flashrt_select", args=(scheme,)))


def attached(llm: Any) -> bool:
    """True when the hook fired in every process that runs `llm`'s model and its handle is active
    (seats may be 0 where everything was refused or kept: see report()). False is "never ran"."""
    reports = report(llm)
    return bool(reports) and all(r.get("hooked") and r.get("active") for r in reports)


__all__ = ["ENV", "EngineSeat", "attached", "install_load_hook", "receipt", "report",
           "save_receipt", "select", "uninstall_load_hook"]

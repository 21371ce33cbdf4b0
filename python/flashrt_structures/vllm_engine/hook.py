"""The load hook, in the process that runs the model: the request read from the environment,
the wrap of vLLM's `process_weights_after_loading` (Note [The window on CPU]), and the record of
what it did to each model, with its built seat sets and the one attached."""

from __future__ import annotations

import atexit
import json
import logging
import os
import traceback
import weakref
from typing import Any

from torch import nn

from .. import _core, catalog, swap
from ..autoswap import notes_of
from . import tree
from .adapters import build_seats

log = logging.getLogger("flashrt")

# The request travels to vLLM's spawned engine core in this variable (install_load_hook()).
ENV = "FLASHRT_VLLM"

# model -> what the hook did to it, in the process that runs the model.
RECORDS: weakref.WeakKeyDictionary[nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()
_PATCHED: dict[str, Any] = {}


def request() -> dict[str, Any] | None:
    """The request install_load_hook() left in the environment, or None."""
    raw = os.environ.get(ENV)
    return json.loads(raw) if raw else None


def _options(request: dict[str, Any], scheme: str) -> _core.PlanOptions:
    options = _core.PlanOptions()
    options.structures = list(request.get("structures") or [])
    options.scheme = scheme
    options.min_seat_weights = request.get("min_seat_weights")
    return options


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
    record["handle"] = swap.attach(model, swaps, notes=notes, placed=placed, log_line=log_line)
    record["seats"] = len(record["handle"].records)


def _hooked_load(original):
    def process_weights_after_loading(model: nn.Module, model_config: Any, target_device: Any):
        req = request()
        if req is None or model in RECORDS:
            return original(model, model_config, target_device)
        record: dict[str, Any] = {"hooked": True, "pid": os.getpid(), "request": req,
                                  "seats": 0, "refused": [], "error": ""}
        RECORDS[model] = record
        held, everywhere = None, []
        try:
            why = tree.whole_engine_refusal(model, model_config)
            if not why:
                graph, hooked, held = tree.describe(model)
                outside = tree.undescribed(model)
        except Exception as e:  # noqa: BLE001 - the hook never stops the engine
            why = f"observation failed: {type(e).__name__}: {e}"
        if why:  # every site named, read before the engine repacks the weights
            try:
                everywhere = tree.whole_engine_refusals(model, why)
            except Exception:  # noqa: BLE001 - the hook never stops the engine
                everywhere = []
        original(model, model_config, target_device)
        try:
            model.eval()
            if why:
                refused = everywhere or [("", why)]
                record.update(refused=refused, explain=f"every projection refused: {why}")
                record["handle"] = swap.attach(model, {}, notes={"refused": refused,
                                                                 "door": "vllm_engine"})
                return
            assert held is not None  # described above: nothing refused the whole engine
            tree.observe_forward(model, graph, hooked, held)
            # The door's own refusals (layers it reads, banks the bank op cannot compute) name
            # their sites; the plan's account of the same weights is dropped for them.
            named = {site for site, _ in outside}
            sets: dict[str, tuple] = {}
            for scheme in [req.get("scheme", "auto")] + list(req.get("alternates") or []):
                plan = _core.plan(graph, catalog.shipped(), _options(req, scheme))
                notes = notes_of(plan)
                notes["refused"] = [r for r in notes["refused"] if r[0] not in named] + outside
                notes["door"] = "vllm_engine"
                sets.setdefault(notes["scheme"]["name"],
                                (plan, *build_seats(model, plan, held), notes))
            held = None  # the seats hold their packed weights; the host's go with the engine's
            record["sets"] = sets
            select_set(model, record, next(iter(sets)), log_line=True)
        except Exception as e:  # noqa: BLE001 - the hook never stops the engine
            record["error"] = f"{type(e).__name__}: {e}"
            record["handle"] = None
            log.error("[flashrt] hook failed, host runs unmodified: %s\n%s", record["error"],
                      traceback.format_exc())
        finally:
            held = None

    process_weights_after_loading._frt_original = original  # type: ignore[attr-defined]
    return process_weights_after_loading


def patch_loader() -> None:
    """Wraps the loader's post-processing call, once per process."""
    if "loader" in _PATCHED:
        return
    from vllm.model_executor.model_loader import base_loader
    original = base_loader.process_weights_after_loading
    base_loader.process_weights_after_loading = _hooked_load(original)
    _PATCHED["loader"] = original


@atexit.register
def _detach_all() -> None:
    """Engines keep their model until the interpreter ends: their seats go first, before the
    extension's own teardown."""
    for record in list(RECORDS.values()):
        handle = record.pop("handle", None)
        if handle is not None:
            handle.detach()
    RECORDS.clear()

"""The load hook, in the process that runs the model: the request read from the environment,
the wrap of vLLM's `process_weights_after_loading` (Note [The window on CPU]), and the record of
what it did to each model, with its built seat sets and the one attached."""

from __future__ import annotations

import atexit
import logging
import os
import traceback
import weakref
from typing import Any

from torch import nn

from ..engine_door import detach_all, plan_sets, refuse_all, request_in, select_set
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
    return request_in(ENV)


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
                refuse_all(model, record, everywhere, why, "vllm_engine")
                return
            assert held is not None  # described above: nothing refused the whole engine
            tree.observe_forward(model, graph, hooked, held)
            # The door's own refusals (layers it reads, banks the bank op cannot compute) name
            # their sites; the plan's account of the same weights is dropped for them.
            sets = plan_sets(graph, req, outside, "vllm_engine",
                             lambda plan: build_seats(model, plan, held))
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


atexit.register(detach_all, RECORDS)

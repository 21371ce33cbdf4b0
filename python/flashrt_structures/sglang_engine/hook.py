"""The load hook, in SGLang's scheduler process: the request read from the environment, the wrap
of `DefaultModelLoader.postprocess_weights` (Note [The window in SGLang]), and the record of what
it did to each model, with its built seat sets and the one attached."""

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

# The request travels to SGLang's spawned scheduler in this variable (install()).
ENV = "FLASHRT_SGLANG"
DOOR = "sglang_engine"

# model -> what the hook did to it, in the process that runs the model.
RECORDS: weakref.WeakKeyDictionary[nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()
_PATCHED: dict[str, Any] = {}


def request() -> dict[str, Any] | None:
    """The request install() left in the environment, or None."""
    return request_in(ENV)


def seat_model(model: nn.Module, req: dict[str, Any], postprocess: Any) -> None:
    """The window: describe and hold, let SGLang post-process (`postprocess()`), then observe,
    plan each scheme of the request, build its seats and attach the first set."""
    record: dict[str, Any] = {"hooked": True, "pid": os.getpid(), "request": req, "seats": 0,
                              "refused": [], "error": ""}
    RECORDS[model] = record
    held, everywhere = None, []
    try:
        why = tree.whole_engine_refusal(model)
        if not why:
            graph, hooked, held = tree.describe(model)
            outside = tree.undescribed(model)
    except Exception as e:  # noqa: BLE001 - the hook never stops the engine
        why = f"observation failed: {type(e).__name__}: {e}"
    if why:
        try:
            everywhere = [(site, why) for site in tree.sites(model)]
        except Exception:  # noqa: BLE001 - the hook never stops the engine
            everywhere = []
    postprocess()
    try:
        model.eval()
        if why:
            refuse_all(model, record, everywhere, why, DOOR)
            return
        assert held is not None  # described above: nothing refused the whole engine
        outside = outside + tree.repacked(model)
        tree.keep_out(graph, outside)
        for site, _ in outside:
            held.pop(site, None)
        pairs = tree.observe_calls(model, graph, hooked, held)
        sets = plan_sets(graph, req, outside, DOOR,
                         lambda plan: build_seats(model, plan, held, pairs))
        held = None  # the seats hold their packed weights; the host's stay with SGLang
        record["sets"] = sets
        select_set(model, record, next(iter(sets)), log_line=True)
    except Exception as e:  # noqa: BLE001 - the hook never stops the engine
        record["error"] = f"{type(e).__name__}: {e}"
        record["handle"] = None
        log.error("[flashrt] hook failed, host runs unmodified: %s\n%s", record["error"],
                  traceback.format_exc())
    finally:
        held = None


def _hooked_postprocess(original):
    def postprocess_weights(model: nn.Module, target_device: Any):
        req = request()
        if req is None or model in RECORDS:
            return original(model, target_device)
        seat_model(model, req, lambda: original(model, target_device))
        return None

    postprocess_weights._frt_original = original  # type: ignore[attr-defined]
    return postprocess_weights


def _updating(name: str, original):
    """A weight update of SGLang's (`WeightUpdater.update_weights_from_*`): the seats hold packed
    copies of the weights they were built from, so before SGLang writes new values every seat set
    here is detached and dropped, the host runs, and the report says why."""
    def update(self, *args, **kwargs):
        for model, record in list(RECORDS.items()):
            if record.get("handle") is not None or record.get("sets"):
                select_set(model, record, None)
                record["sets"] = {}
                record["detached"] = (f"SGLang updated the weights ({name}) after seating: the "
                                      "seats held the old ones, so the host runs from here on")
                log.warning("[flashrt] %s", record["detached"])
        return original(self, *args, **kwargs)
    update._frt_original = original  # type: ignore[attr-defined]
    return update


def patch_loader() -> None:
    """Wraps the loader's post-processing call and SGLang's weight updates, once per process."""
    if "loader" in _PATCHED:
        return
    from sglang.srt.model_loader.loader import DefaultModelLoader
    original = DefaultModelLoader.postprocess_weights
    DefaultModelLoader.postprocess_weights = staticmethod(_hooked_postprocess(original))
    _PATCHED["loader"] = original
    try:
        from sglang.srt.model_executor.model_runner_components.weight_updater import (
            WeightUpdater,
        )
    except ImportError:  # another SGLang layout: updates are not reached (docs/doors/sglang.md)
        return
    for name in [n for n in vars(WeightUpdater) if n.startswith("update_weights_from")]:
        setattr(WeightUpdater, name, _updating(name, getattr(WeightUpdater, name)))


atexit.register(detach_all, RECORDS)

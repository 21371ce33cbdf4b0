"""vLLM's `vllm.general_plugins` entry point `flashrt` (pyproject.toml), loaded by vLLM in every
one of its processes: it patches the loader only where the request is in the environment, and
always gives vLLM's workers `flashrt_report` and `flashrt_select`, which the parent reaches
through vLLM's own `collective_rpc` (reports.py)."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import nn

from . import hook

log = logging.getLogger("flashrt")

PLUGIN = "flashrt"
PLUGIN_GROUP = "vllm.general_plugins"


def report_of(model: nn.Module | None) -> dict[str, Any]:
    """What the hook did in this process to `model`, as plain data (it crosses processes)."""
    record = hook.RECORDS.get(model) if model is not None else None
    if record is None:
        why = ("the hook was not asked for in this process (install_load_hook() was called after "
               "this engine started, or not at all)" if hook.request() is None else
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


def _worker_report(worker: Any) -> dict[str, Any]:
    runner = getattr(worker, "model_runner", None)
    return report_of(getattr(runner, "model", None))


def _worker_select(worker: Any, scheme: str | None) -> dict[str, Any]:
    runner = getattr(worker, "model_runner", None)
    model = getattr(runner, "model", None)
    record = hook.RECORDS.get(model) if model is not None else None
    if (model is None or record is None
            or (scheme is not None and scheme not in record.get("sets", {}))):
        built = sorted(record.get("sets", {})) if record else []
        raise ValueError(f"flashrt: no seat set {scheme!r} was built in this engine "
                         f"(built: {built}; install_load_hook(alternates=...))")
    hook.select_set(model, record, scheme)
    return report_of(model)


def _plugin() -> None:
    """vLLM's `vllm.general_plugins` entry point, run in every vLLM process: acts only when the
    parent asked (the request is in the environment)."""
    try:
        from vllm.v1.worker.worker_base import WorkerBase
        WorkerBase.flashrt_report = _worker_report  # what the hook did here
        WorkerBase.flashrt_select = _worker_select  # A/B: switch between built seat sets
    except Exception as e:  # noqa: BLE001 - a plugin never stops vLLM
        log.error("[flashrt] plugin could not reach vLLM's worker: %s", e)
    if hook.request() is not None:
        hook.patch_loader()


def registered() -> str:
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

"""vLLM's `vllm.general_plugins` entry point `flashrt` (pyproject.toml), loaded by vLLM in every
one of its processes: it patches the loader only where the request is in the environment, and
always gives vLLM's workers `flashrt_report` and `flashrt_select`, which the parent reaches
through vLLM's own `collective_rpc` (reports.py)."""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from .. import engine_door
from . import hook

log = logging.getLogger("flashrt")

PLUGIN = "flashrt"
PLUGIN_GROUP = "vllm.general_plugins"


def report_of(model: nn.Module | None) -> dict[str, Any]:
    """What the hook did in this process to `model`, as plain data (it crosses processes)."""
    record = hook.RECORDS.get(model) if model is not None else None
    why = ("the hook was not asked for in this process (install_load_hook() was called after "
           "this engine started, or not at all)" if hook.request() is None else
           "the hook is installed here but did not see this model load")
    return engine_door.report_of(record, why)


def _worker_report(worker: Any) -> dict[str, Any]:
    runner = getattr(worker, "model_runner", None)
    return report_of(getattr(runner, "model", None))


def _worker_select(worker: Any, scheme: str | None) -> dict[str, Any]:
    runner = getattr(worker, "model_runner", None)
    model = getattr(runner, "model", None)
    record = hook.RECORDS.get(model) if model is not None else None
    engine_door.select_built(model, record, scheme, "install_load_hook(alternates=...)")
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
    # vLLM splits its list on commas as it is (no stripping); an empty list loads nothing.
    return engine_door.plugin_registered(PLUGIN_GROUP, PLUGIN, "VLLM_PLUGINS",
                                         lambda value: PLUGIN in value.split(","))

"""SGLang's `sglang.srt.plugins` entry point `flashrt` (pyproject.toml), loaded by SGLang in every
one of its processes: it wraps the loader only where the request is in the environment, and always
gives SGLang's `Scheduler` `flashrt_report` and `flashrt_select`, which the user's process reaches
through the engine's `collective_rpc` (reports.py). SGLang's RPC carries flat scalars and answers
only success or failure, so each writes its report as JSON into the folder it is handed."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from torch import nn

from .. import engine_door
from . import hook

log = logging.getLogger("flashrt")

PLUGIN = "flashrt"
PLUGIN_GROUP = "sglang.srt.plugins"


def _model(scheduler: Any) -> nn.Module | None:
    runner = getattr(getattr(scheduler, "tp_worker", None), "model_runner", None)
    return getattr(runner, "model", None)


def report_of(model: nn.Module | None) -> dict[str, Any]:
    """What the hook did in this process to `model`, as plain data (it crosses processes)."""
    record = hook.RECORDS.get(model) if model is not None else None
    why = ("the hook was not asked for in this process (install() was called after this engine "
           "started, or not at all)" if hook.request() is None else
           "the hook is installed here but did not see this model load")
    return engine_door.report_of(record, why)


def _write(directory: str, report: dict[str, Any]) -> None:
    path = Path(directory) / f"{os.getpid()}.json"
    path.write_text(json.dumps(report, default=str))


def _scheduler_report(scheduler: Any, directory: str) -> None:
    _write(directory, report_of(_model(scheduler)))


def _scheduler_select(scheduler: Any, directory: str, scheme: str | None = None) -> None:
    model = _model(scheduler)
    record = hook.RECORDS.get(model) if model is not None else None
    engine_door.select_built(model, record, scheme, "install(alternates=...)")
    _write(directory, report_of(model))


def _plugin() -> None:
    """SGLang's `sglang.srt.plugins` entry point, run in every SGLang process: acts only when the
    user's process asked (the request is in the environment)."""
    try:
        from sglang.srt.managers.scheduler import Scheduler
        Scheduler.flashrt_report = _scheduler_report  # what the hook did here
        Scheduler.flashrt_select = _scheduler_select  # A/B: switch between built seat sets
    except Exception as e:  # noqa: BLE001 - a plugin never stops SGLang
        log.error("[flashrt] plugin could not reach SGLang's scheduler: %s", e)
    if hook.request() is not None:
        hook.patch_loader()


def registered() -> str:
    """"" when SGLang will load this package's plugin in its processes; otherwise why not."""
    # SGLang strips each name, and an empty list is no restriction (load_plugins_by_group).
    return engine_door.plugin_registered(
        PLUGIN_GROUP, PLUGIN, "SGLANG_PLUGINS",
        lambda value: not value or PLUGIN in {x.strip() for x in value.split(",") if x.strip()})

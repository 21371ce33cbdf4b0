"""The door in the user's process: `install_load_hook()` asks every vLLM engine built from now
on to seat its model, refusing where the hook could not reach the process that runs it."""

from __future__ import annotations

import json
import os
import sys
import weakref
from typing import Any

from ..engine_door import check_request
from . import hook, plugin

# Engines that were running, unhooked, when a hook was installed with allow_started=True.
_ACCEPTED: weakref.WeakSet[Any] = weakref.WeakSet()


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
    request = check_request(scheme, structures, min_seat_weights, alternates)
    if _multiprocess() and (why := plugin.registered()):
        raise RuntimeError(
            "flashrt: refused: vLLM's engine core runs in a spawned process that this hook "
            f"cannot reach: {why}. Install the package (its plugin is loaded in every vLLM "
            "process), or run the engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    if hook.request() is None:
        # Engines running now loaded their model without a request: the hook cannot reach them.
        live = [e for e in _live_engines() if e not in _ACCEPTED]
        if live and not allow_started:
            raise RuntimeError(
                f"flashrt: refused: {len(live)} vLLM engine(s) already run in this process; "
                "their model was loaded without the hook and stays unseated. Call "
                "install_load_hook() before LLM(...), or pass allow_started=True to hook only "
                "engines built from now on")
        _ACCEPTED.update(live)
    os.environ[hook.ENV] = json.dumps(request)
    hook.patch_loader()
    return request


def uninstall_load_hook() -> None:
    """Engines built from now on load unseated (attached engines keep their seats)."""
    os.environ.pop(hook.ENV, None)

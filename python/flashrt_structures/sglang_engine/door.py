"""The door in the user's process: `install()` asks every SGLang engine built from now on to seat
its model in its scheduler process, refusing where the hook could not reach that process."""

from __future__ import annotations

import json
import os
import sys
import weakref
from typing import Any

from ..engine_door import check_request
from . import hook, plugin

# Engines that were running, unhooked, when the door was installed with allow_started=True.
_ACCEPTED: weakref.WeakSet[Any] = weakref.WeakSet()


def _live_engines() -> list[Any]:
    mod = sys.modules.get("sglang.srt.entrypoints.engine")
    if mod is None:
        return []
    import gc

    def running(engine: Any) -> bool:  # shutdown() closes the engine's RPC socket
        return getattr(engine, "send_to_rpc", None) is not None
    return [o for o in gc.get_objects() if isinstance(o, mod.Engine) and running(o)]


def install(scheme: str = "auto", structures: list[str] | None = None, *,
            min_seat_weights: int | None = None, alternates: list[str] | None = None,
            allow_started: bool = False) -> dict[str, Any]:
    """Asks every SGLang engine built from now on to seat its model in the scheduler process:
    after the weights load, in SGLang's post-processing (Note [The window in SGLang]), the hook
    observes the model, plans in the core and attaches seats, and logs `[flashrt] N seats, M
    refused` there. Returns the request. Idempotent. alternates: further schemes whose seats are
    built too and held detached, for paired A/B runs in one engine (`select(engine, scheme)`;
    None is the host alone).

    Refused (RuntimeError), never silent, where the hook could not reach the scheduler: the
    plugin is not installed, or `SGLANG_PLUGINS` excludes it; an engine already runs in this
    process (its scheduler loaded without the request; allow_started=True hooks only the engines
    built from now on)."""
    request = check_request(scheme, structures, min_seat_weights, alternates)
    if why := plugin.registered():
        raise RuntimeError(
            "flashrt: refused: SGLang runs the model in a spawned scheduler process that this "
            f"door reaches only through its plugin: {why}")
    if hook.request() is None:
        live = [e for e in _live_engines() if e not in _ACCEPTED]
        if live and not allow_started:
            raise RuntimeError(
                f"flashrt: refused: {len(live)} SGLang engine(s) already run in this process; "
                "their scheduler loaded the model without the hook and it stays unseated. Call "
                "install() before sglang.Engine(...), or pass allow_started=True to hook only "
                "engines built from now on")
        _ACCEPTED.update(live)
    os.environ[hook.ENV] = json.dumps(request)
    return request


def uninstall() -> None:
    """Engines built from now on load unseated (attached engines keep their seats)."""
    os.environ.pop(hook.ENV, None)

"""What the hook did, read from the user's process: the scheduler's report through SGLang's
`collective_rpc` (the plugin's `flashrt_report` / `flashrt_select`, which write it as JSON into a
folder this process hands them), and the engine's receipt."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from .. import receipt as receipts
from . import plugin


def _rpc(engine: Any, method: str, **params: Any) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="flashrt-sglang-") as d:
        try:
            engine.collective_rpc(method, directory=d, **params)
        except AssertionError as e:  # SGLang's RPC asserts its success flag
            message = str(e)
            if "has no attribute 'flashrt_" in message:
                why = plugin.registered() or "it was installed after the engine started"
                return [{"hooked": False, "reason": "the engine's scheduler did not load the "
                         f"flashrt plugin ({why})"}]
            raise RuntimeError(f"flashrt: {method} failed in SGLang's scheduler: {message}"
                               ) from None
        return [json.loads(p.read_text()) for p in sorted(Path(d).glob("*.json"))]


def report(engine: Any) -> list[dict[str, Any]]:
    """What the hook did, from each scheduler process that runs `engine`'s model: `hooked`,
    `pid`, `seats`, `refused` [(site, reason)], `summary` (calls, band dispatches, fallbacks,
    ...), `seats_report` (per seat), `explain`, `receipt`, or `reason` when it never ran."""
    return _rpc(engine, "flashrt_report")


def receipt(engine: Any) -> dict[str, Any]:
    """The receipt of `engine`'s seats (docs/receipts.md): the plan and the ledger of the
    scheduler that runs its model, and that process's environment lock."""
    return receipts.of_workers(report(engine), "sglang_engine")


def save_receipt(engine: Any, directory: str | Path) -> Path:
    """Writes receipt(engine) to `directory`/receipt.json (the folder is created); its path."""
    return receipts.save(receipt(engine), directory)


def select(engine: Any, scheme: str | None) -> list[dict[str, Any]]:
    """Switches the scheduler of `engine` to the seat set built for `scheme` (its main scheme or
    one of the alternates), or to the host alone (None); returns the reports."""
    return _rpc(engine, "flashrt_select", scheme=scheme)


def attached(engine: Any) -> bool:
    """True when the hook fired in the process that runs `engine`'s model and its handle is
    active (seats may be 0 where everything was refused or kept: see report())."""
    reports = report(engine)
    return bool(reports) and all(r.get("hooked") and r.get("active") for r in reports)

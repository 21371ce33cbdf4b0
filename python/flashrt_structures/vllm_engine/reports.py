"""What the hook did, read from the user's process: each worker's report through vLLM's
`collective_rpc` (the plugin's `flashrt_report` / `flashrt_select`), and the engine's receipt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import receipt as receipts
from . import plugin


def report(llm: Any) -> list[dict[str, Any]]:
    """What the hook did, from each process that runs `llm`'s model (one entry per worker):
    `hooked`, `seats`, `refused` [(site, reason)], `summary` (calls, band dispatches,
    fallbacks, ...), `seats_report` (per seat), `explain`, `receipt` (that process's receipt:
    receipt(llm) gathers them), or `reason` when it never ran."""
    try:
        return list(llm.collective_rpc("flashrt_report"))
    except NotImplementedError:
        return [{"hooked": False, "reason": "the engine's process did not load the flashrt plugin "
                 f"({plugin.registered() or 'it was installed after the engine started'})"}]


def receipt(llm: Any) -> dict[str, Any]:
    """The receipt of `llm`'s seats (docs/receipts.md): the plan and the ledger of the process
    that runs its model (its first worker; `workers` holds each one's), and that process's
    environment lock. A worker where the hook never ran is listed with its reason."""
    return receipts.of_workers(report(llm), "vllm_engine")


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

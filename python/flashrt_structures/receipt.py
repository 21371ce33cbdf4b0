"""Receipts: what a door seated, judged and measured, and the environment it did so in.

A receipt is one JSON object (docs/receipts.md names every field): the door, the plan (each
seat's site, structure, impl, kernel package and op, form; what stayed at host and what was
refused, with the reasons), the door's measurements (the gated door's units, decode_loop's
self-check, adoption's conversion check, bind's certification), the seats' ledger as it stands
when the receipt is taken, and the environment lock (`envlock`). `check_receipt(path)` reads a
saved one back and lists what drifted in the environment since.

Every door builds its receipt here from what its handle already holds; nothing is measured again.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import envlock

if TYPE_CHECKING:
    from .swap import AttachHandle

RECEIPT_VERSION = 1
FILE_NAME = "receipt.json"


def plain(value: Any) -> Any:
    """JSON-ready: bound enums by name, tuples as lists, non-finite floats as text."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [plain(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    name = getattr(value, "name", None)
    if isinstance(name, str):  # nb::enum_ values
        return name
    return str(value)


def _reasons(pairs: Iterable[Any]) -> list[dict[str, str]]:
    return [{"site": str(site), "reason": str(why)} for site, why in pairs]


def _seat(record: Any) -> dict[str, Any]:
    """One seat of a handle: from its plan (SeatPlan) where the door kept it, else its form."""
    module, form = record.seat, record.seat.seat.form
    plan = getattr(module, "plan", None)
    entry: dict[str, Any] = {
        "site": record.site, "structure": form.structure, "impl": form.impl,
        "package": plan.package if plan is not None else None, "op": plain(form.op),
        "form": form.describe(), "weights": form.weights, "dtype": plain(form.dtype),
        "band": [form.band_min, form.band_max], "restored": record.restored,
    }
    if plan is not None:
        entry.update(replaces=list(plan.replaces), activation=plain(plan.activation),
                     ladder=list(plan.ladder))
    certification = getattr(module, "certification", None)  # get(name).bind's own check
    if certification is not None:
        entry["certification"] = plain(certification)
    return entry


def _planned_seat(sp: Any) -> dict[str, Any]:
    """One seat of a core Plan that was not (or not yet) attached."""
    return {"site": sp.site, "structure": sp.seam.structure, "impl": sp.impl,
            "package": sp.package, "op": plain(sp.op), "form": sp.form.describe(),
            "band": [sp.band_min, sp.band_max], "replaces": list(sp.replaces),
            "activation": plain(sp.activation), "ladder": list(sp.ladder)}


def plan_of_core(plan: Any) -> dict[str, Any]:
    """The plan section from a core Plan (a door that planned but attached nothing)."""
    return {
        "scheme": {"name": plan.scheme.name,
                   "formats": {s: f.describe() for s, f in plan.scheme.formats.items()}},
        "seats": [_planned_seat(sp) for sp in plan.seats],
        "keep_host": _reasons(plan.keep_host),
        "refused": _reasons(plan.refused),
        "assumed": list(plan.assumed),
        "kernel_unavailable": [{"repo": e.repo, "version": e.version, "error": e.error,
                                "detail": e.detail} for e in plan.kernel_unavailable],
    }


def plan_of_decode(plan: Any, handle: AttachHandle | None) -> dict[str, Any]:
    """The plan section of a decode loop: the core's DecodePlan (binding, shape, the module of
    each slot per layer) and the seats attached on the host when the loop was built."""
    c = plan.config
    return {
        "binding": plan.binding,
        "config": {**{k: getattr(c, k) for k in (
            "layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab",
            "max_len", "sequences", "eps", "norm_plus_one", "rotary_dim", "embed_scale",
            "residual_scale", "attention_scale", "attention_softcap", "logits_divisor",
            "final_softcap")},
            "cache_dtype": plain(c.cache_dtype),
            "layer": [{"window": lc.window, "rotary": lc.rotary,
                       "qk_norm": plain(lc.qk_norm)} for lc in c.layer]},
        "embed": plan.embed, "head": plan.head, "stack": dict(plan.stack),
        "layers": [{"slots": dict(layer.slots), "mlp_seated": layer.mlp_seated,
                    "activation": plain(layer.activation)} for layer in plan.layers],
        "seated": plan.seated,
        "seats": [_seat(r) for r in handle.records] if handle is not None else [],
        "keep_host": [],
        "refused": _reasons(plan.refused),
        "assumed": list(plan.assumed),
    }


def plan_of_handle(handle: AttachHandle | None, notes: dict[str, Any]) -> dict[str, Any]:
    """The plan section from an attach handle's records and its notes."""
    scheme = notes.get("scheme", {})
    return {
        "scheme": plain({k: v for k, v in scheme.items() if k != "keep_host"}),
        "seats": [_seat(r) for r in handle.records] if handle is not None else [],
        "keep_host": _reasons(scheme.get("keep_host", {}).items()),
        "refused": _reasons(notes.get("refused", [])),
        "assumed": plain(notes.get("assumed", [])),
        "kernel_unavailable": plain(notes.get("kernel_unavailable", [])),
        "accuracy": plain(notes.get("accuracy", {})),
        "weight_pages": plain(notes.get("weight_pages", {})),
    }


def ledger_of_handle(handle: AttachHandle | None) -> dict[str, Any]:
    """The ledger as it stands now: the handle's summary and each seat's counts."""
    if handle is None:
        return {"summary": None, "seats": []}
    return {"summary": plain(handle.summary()),
            "seats": [{k: plain(v) for k, v in r.items()
                       if k in ("site", "calls", "fallbacks", "band_dispatches", "last_reason",
                                "reasons", "restored")} for r in handle.report()]}


def assemble(door: str, host: str, plan: dict[str, Any], ledger: dict[str, Any],
             measurements: dict[str, Any]) -> dict[str, Any]:
    """A complete receipt (receipts.md), with this process's environment lock."""
    return {
        "receipt_version": RECEIPT_VERSION,
        "door": door,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": host,
        "plan": plan,
        "measurements": plain(measurements),
        "ledger": ledger,
        "environment": envlock.capture(),
    }


def of_handle(handle: AttachHandle, door: str | None = None) -> dict[str, Any]:
    """The receipt of an attach handle (auto_swaps, swap.attach, adopt, the gated door, the
    engines): its door's name and measurements are in its notes where a door put them."""
    notes = handle.notes
    return assemble(door or notes.get("door", "swap.attach"), type(handle.root).__name__,
                    plan_of_handle(handle, notes), ledger_of_handle(handle),
                    notes.get("measurements", {}))


def of_plan(door: str, host: str, plan: Any, handle: AttachHandle | None,
            measurements: dict[str, Any]) -> dict[str, Any]:
    """The receipt of a door that holds a core Plan: from its handle where it attached seats
    (the ledger with them), else from the plan itself."""
    section = (plan_of_handle(handle, handle.notes) if handle is not None
               else plan_of_core(plan))
    return assemble(door, host, section, ledger_of_handle(handle), measurements)


def of_gated(handle: AttachHandle | None, notes: dict[str, Any], host: str,
             measurements: dict[str, Any]) -> dict[str, Any]:
    """The gated door's receipt: its plan and units, with the ledger of the seats it kept."""
    return assemble("attach", host, plan_of_handle(handle, notes), ledger_of_handle(handle),
                    measurements)


def of_decode(loop: Any, handle: AttachHandle | None) -> dict[str, Any]:
    """A decode loop's receipt: its DecodePlan, the self-check it passed and its last timings,
    and the ledger of the seats attached on the host (whose packed weights the loop reads)."""
    return assemble("decode_loop", type(loop.model).__name__, plan_of_decode(loop.plan, handle),
                    ledger_of_handle(handle),
                    {"self_check": loop.self_check, "timing": dict(loop.timing),
                     "weight_bytes": loop.weight_bytes})


def of_workers(reports: list[dict[str, Any]], door: str) -> dict[str, Any]:
    """An engine's receipt from its workers' reports (vllm_engine.report, sglang_engine.report):
    the first seated worker's receipt, with every worker's plan, ledger and state under
    measurements.workers; `door` names the engine door."""
    workers = []
    for r in reports:
        own = r.get("receipt")
        workers.append({"pid": r.get("pid"), "hooked": bool(r.get("hooked")),
                        "active": bool(r.get("active")), "scheme": r.get("scheme"),
                        "reason": r.get("reason") or r.get("error") or "",
                        "plan": own["plan"] if own else None,
                        "ledger": own["ledger"] if own else None})
    first = next((r["receipt"] for r in reports if r.get("receipt")), None)
    if first is None:  # the hook ran nowhere: what it would have seated is unknown
        return assemble(door, "", plan_of_handle(None, {}), ledger_of_handle(None),
                        {"workers": workers})
    return {**first, "door": door, "measurements": {"workers": workers}}


class GateRecord(dict):
    """The gated door's record (`FrontDoorResult.receipt`): read as a dict it holds what it
    always held (scheme, output_kind, units, floors, min_speedup, rounds, torch); called,
    `result.receipt()`, it builds the full receipt with the ledger as it stands then."""

    def __init__(self, data: dict[str, Any] | None = None, build: Any = None) -> None:
        super().__init__(data or {})
        self._build = build

    def __call__(self) -> dict[str, Any]:
        if self._build is None:
            raise ValueError("flashrt: this record was not made by attach(); no receipt to build")
        result: dict[str, Any] = self._build()
        return result


def save(receipt: dict[str, Any], directory: str | Path) -> Path:
    """Writes `receipt.json` into `directory` (created) and returns its path."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAME
    path.write_text(json.dumps(receipt, indent=2, sort_keys=False) + "\n")
    return path


# ------------------------------------------------------------------------ reading one back


def _need(obj: Any, key: str, kind: type | tuple[type, ...], where: str,
          nullable: bool = False) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ValueError(f"flashrt: malformed receipt: {where}{key} is missing")
    value = obj[key]
    if value is None and nullable:
        return value
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ValueError(f"flashrt: malformed receipt: {where}{key} is "
                         f"{type(value).__name__}, not {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _check_environment(env: Any) -> dict[str, Any]:
    """The lock's fields that drift() reads, each of the right type (ValueError otherwise)."""
    if not isinstance(env, dict):
        raise ValueError("flashrt: malformed receipt: environment is not an object")
    _need(env, "flashrt", str, "environment.", nullable=True)
    _need(env, "python", str, "environment.")
    libraries = _need(env, "libraries", dict, "environment.")
    for name in libraries:
        _need(libraries, name, str, "environment.libraries.", nullable=True)
    cpu = _need(env, "cpu", dict, "environment.")
    for key in ("arch", "model", "tier"):
        _need(cpu, key, str, "environment.cpu.")
    kernels = _need(env, "kernels", list, "environment.")
    for i, k in enumerate(kernels):
        where = f"environment.kernels[{i}]."
        if not isinstance(k, dict):
            raise ValueError(f"flashrt: malformed receipt: {where[:-1]} is not an object")
        _need(k, "repo", str, where)
        for key in ("version", "revision", "variant", "sha256"):
            _need(k, key, str, where, nullable=True)
    return env


def load(path: str | Path) -> dict[str, Any]:
    """A saved receipt (the file, or the folder save_receipt wrote it into), checked: ValueError
    naming the problem when it is missing, not JSON, of another receipt_version, or malformed."""
    p = Path(path)
    if p.is_dir():
        p = p / FILE_NAME
    try:
        text = p.read_text()
    except OSError as e:
        raise ValueError(f"flashrt: cannot read the receipt {p}: {e.strerror or e}") from None
    try:
        receipt = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"flashrt: {p} is not JSON ({e.msg} at line {e.lineno} column "
                         f"{e.colno})") from None
    if not isinstance(receipt, dict):
        raise ValueError(f"flashrt: {p} is not a receipt (a JSON {type(receipt).__name__}, "
                         "not an object)")
    if "receipt_version" not in receipt:
        raise ValueError(f"flashrt: {p} is not a receipt (no receipt_version)")
    version = receipt["receipt_version"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"flashrt: {p}: receipt_version {version!r} is not a version number")
    if version != RECEIPT_VERSION:
        raise ValueError(f"flashrt: {p}: receipt_version {version} is not one this flashrt "
                         f"reads (it reads {RECEIPT_VERSION}); "
                         + ("use the flashrt that wrote it" if version > RECEIPT_VERSION
                            else "re-run the door to write a new one"))
    try:
        _check_environment(receipt.get("environment"))
    except ValueError as e:
        raise ValueError(f"{e} (in {p})") from None
    return receipt


def check_receipt(path: str | Path) -> list[str]:
    """What drifted in the environment lock of the receipt at `path` against this machine now,
    one readable line each ("torch 2.5.1 -> 2.6.0", "flashrt/gemm library digest changed
    (...)", "CPU tier avx512vnni -> avx2"); an empty list means the receipt's run can be
    repeated here. ValueError for a file that is not a receipt this flashrt reads."""
    return envlock.drift(load(path)["environment"])

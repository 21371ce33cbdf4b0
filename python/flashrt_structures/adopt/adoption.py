"""adopt_prequantized: seat a quantised checkpoint's own blocks instead of requantising the host.

A host loaded from a quantised file (transformers dequantises GGUF to fp32 on load) computes with
the file's values; requantising those costs accuracy a second time. Adoption reads the blocks
from the file (one reader per format: `gguf`, `compressed_tensors`), lays them out for the
kernels unchanged (``from_quantized``: no rounding), checks each against the host's own weight
(the conversion report: 0, or fp32 rounding of d*q + m), and seats them through the same plan,
explain and ledger as every door.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from .. import _core, accuracy, catalog, decisions, seats, swap
from .. import receipt as receipts
from ..autoswap import notes_of
from ..block_seats import build_block_seat
from ..observe import observe
from ..observe.calibration import record
from . import compressed_tensors, gguf
from .source import Source

log = logging.getLogger("flashrt")

FORMATS = ("gguf", "compressed-tensors")


@dataclass
class AdoptionReport:
    """What adopt_prequantized did: the plan (``explain(report)``), the attach handle (ledger,
    summary, detach), and per adopted weight the form and the conversion's max abs difference
    from the host's own weight, keyed by module (a bank's operands by "<module>/<operand>", the
    worst of its experts)."""

    fmt: str
    source: str
    plan: _core.Plan
    handle: swap.AttachHandle | None
    conversion: dict[str, float] = field(default_factory=dict)
    forms: dict[str, str] = field(default_factory=dict)
    host: str = ""  # the host's class name, for a receipt with no handle

    @property
    def core(self) -> _core.Plan:  # explain() reads .core of what it is given
        return self.plan

    @property
    def worst_conversion(self) -> float:
        return max(self.conversion.values(), default=0.0)

    def summary(self) -> dict[str, Any]:
        return {"format": self.fmt, "source": self.source, "adopted": len(self.conversion),
                "max_abs_conversion": self.worst_conversion,
                "refused": len(self.plan.refused), "kept_at_host": len(self.plan.keep_host)}

    def measurements(self) -> dict[str, Any]:
        """What adoption measured: per adopted module its form and the conversion check's max
        abs difference from the host's own weight."""
        return {"adoption": self.summary(), "forms": dict(self.forms),
                "conversion": dict(self.conversion)}

    def receipt(self) -> dict[str, Any]:
        """The plan, the conversion check, the ledger of the adopted seats and the environment
        lock (docs/receipts.md)."""
        return receipts.of_plan("adopt_prequantized", self.host, self.plan, self.handle,
                                self.measurements())

    def save_receipt(self, directory: str | Path) -> Path:
        """Writes receipt() to `directory`/receipt.json (the folder is created); its path."""
        return receipts.save(self.receipt(), directory)


def _host_tensor(model: nn.Module, src: Source) -> torch.Tensor:
    """The host tensor a source stands in for: a module's weight, or a bank operand's
    [experts, out, in] (its slice of a fused tensor's second dimension)."""
    tensor = cast(torch.Tensor, getattr(model.get_submodule(src.module), src.tensor)).detach()
    return tensor.chunk(src.parts, dim=1)[src.part] if src.parts > 1 else tensor


def _check_conversion(sources: dict[str, Source], model: nn.Module, path: str) -> dict[str, float]:
    """Each pack against the host's weight (a bank's, expert by expert): 0, or the rounding of
    d*q + m in fp32, in the host weight's dtype or in the source's own dequantisation, whichever
    is coarsest (a bf16 host, or bf16 scales, hold d*q rounded to bf16; the seat computes it in
    fp32). Anything more means the host's weights are not this checkpoint's."""
    conversion = {}
    for key, src in sources.items():
        packs = [src.pack] if src.pack is not None else src.packs
        if not packs:
            continue
        host = _host_tensor(model, src)
        weights = [host] if src.pack is not None else list(host.unbind(0))
        eps = max(src.rounding, torch.finfo(host.dtype).eps)
        worst = 0.0
        for e, (pack, weight) in enumerate(zip(packs, weights, strict=True)):
            stats = pack.compare(weight.float() if weight.dtype != torch.float32 else weight)
            err = stats.max_abs_err
            if err > 4 * eps * max(stats.max_abs_ref, 1e-30):
                what = (f"{src.module}.{src.tensor}" if not src.operand else
                        f"{src.module}.{src.tensor} (expert {e}'s {src.operand})")
                raise _core.Refused(
                    f"adopt: {what} differs from {path}'s {src.tensor_name} ({src.block_type}) "
                    f"by up to {err:.3g}: the host's weights are not this checkpoint's")
            worst = max(worst, float(err))
        conversion[key] = worst
    return conversion


def _adopted(plan: _core.Plan, sources: dict[str, Source]) -> dict[str, dict[str, Any]]:
    """Per seat site the checkpoint's packs its operands take: a weight's pack by operand, a
    bank's per expert ("gate/0".."gate/<E-1>", "up/<e>", "down/<e>"; seat.h). A bank operand the
    plan reads from another tensor than the one the loader filled is refused."""
    out: dict[str, dict[str, Any]] = {}
    for sp in plan.seats:
        adopted: dict[str, Any] = {}
        for op, slot in sp.slots.items():
            if sp.op != _core.OpKind.moe_ffn:
                src = sources.get(slot.module)
                if slot.tensor == "weight" and src is not None and src.pack is not None:
                    adopted[op] = src.pack
                continue
            src = sources.get(f"{slot.module}/{op}")
            if src is None or not src.packs:
                continue
            if (src.tensor, src.part, src.parts) != (slot.tensor, slot.part, slot.parts):
                raise _core.Refused(
                    f"adopt: transformers' loader puts {src.tensor_name} in part {src.part} of "
                    f"{src.parts} of {src.module}.{src.tensor}; the bank's {op} is part "
                    f"{slot.part} of {slot.parts} of {slot.module}.{slot.tensor}")
            adopted.update({f"{op}/{e}": p for e, p in enumerate(src.packs)})
        out[sp.site] = adopted
    return out


def _source_key(sp: _core.SeatPlan, op: str, slot: _core.SlotTensor) -> str:
    return f"{slot.module}/{op}" if sp.op == _core.OpKind.moe_ffn else slot.module


_READERS: dict[str, Callable[[nn.Module, str | None, gguf.Activations], dict[str, Source]]] = {
    "gguf": lambda model, source, activations: gguf.sources(model, str(source), activations),
    "compressed-tensors": lambda model, source, activations: compressed_tensors.sources(
        model, source),
}


def adopt_prequantized(
    model: nn.Module,
    fmt: str = "gguf",
    source: str | Path | None = None,
    *,
    forward: Callable[[], Any] | None = None,
    structures: list[str] | None = None,
    on_guard_fail: str = "fallback",
    verbose: bool = True,
    activations: gguf.Activations = "host",
) -> AdoptionReport:
    """Seats the checkpoint's own quantised blocks on `model` (loaded from that checkpoint).

    source: the checkpoint the model was loaded from: the .gguf file (gguf); the checkpoint
    directory (compressed-tensors), or None when transformers loaded it compressed and the
    modules still carry their packs (read before the first forward decompresses them).
    forward: one real call of the host for the dataflow (default: the model on one token).
    activations: "host" (default) computes with the host's activations against the file's
    values; "int8" (gguf) seats the 4-, 5- and 6-bit block types (Q4_0, Q4_1, Q4_K, Q5_0,
    Q5_1, Q5_K, Q6_K) in their integer-dot forms instead, activations quantized to int8 per
    block of 32 as llama.cpp does: the same weights, a different numeric form (its forms say
    "activations int8 per 32"; +0.40% perplexity on SmolLM2's Q4_1 file).
    Returns an AdoptionReport; ``explain(report)`` prints the plan, ``report.handle`` is the
    attach handle (ledger, summary, detach)."""
    if fmt not in FORMATS:
        raise ValueError(f"adopt_prequantized: format {fmt!r}; supported: {', '.join(FORMATS)}")
    if activations not in gguf.ACTIVATIONS or (activations != "host" and fmt != "gguf"):
        raise ValueError(f"adopt_prequantized: activations {activations!r} for {fmt}; "
                         f"supported: {', '.join(gguf.ACTIVATIONS)} for gguf, host otherwise")
    if source is None and fmt == "gguf":
        raise ValueError("adopt_prequantized(fmt='gguf') needs source=<the .gguf file the model "
                         "was loaded from>")
    sources = _READERS[fmt](model, None if source is None else str(source), activations)
    path = str(source) if source is not None else f"{type(model).__name__}'s modules"
    if forward is None:
        ids = torch.ones((1, 1), dtype=torch.long)
        forward = lambda: model(ids)  # noqa: E731
    weights = [getattr(model.get_submodule(s.module), s.tensor, None) for s in sources.values()]
    if any(not isinstance(w, torch.Tensor) or not w.is_floating_point() for w in weights):
        # A compressed load: the host's first call decompresses its modules (the library's
        # own hook); the conversion is checked against what that leaves.
        with torch.no_grad():
            forward()
    conversion = _check_conversion(sources, model, path)
    graph = observe(model, [forward])
    options = _core.PlanOptions()
    options.structures = list(structures or [])
    options.source = fmt
    options.source_forms = {k: s.form for k, s in sources.items() if s.form is not None}
    options.source_refusals = {k: s.refusal for k, s in sources.items() if s.refusal}
    options.decisions_path = decisions.path()
    plan = _core.plan(graph, catalog.shipped(), options)
    adopted = _adopted(plan, sources)  # checked before any seat is built
    swaps = {sp.site: seats.build(model, sp, adopted=adopted[sp.site]) for sp in plan.seats
             if sp.op != _core.OpKind.block}
    for sp in plan.seats:  # a layer's block runs the seats of its parts, built above
        if sp.op == _core.OpKind.block:
            swaps[sp.site] = build_block_seat(model, sp, swaps)
    report = AdoptionReport(fmt, path, plan, None, host=type(model).__name__)
    for sp in plan.seats:
        for op, slot in sp.slots.items():
            key = _source_key(sp, op, slot)
            if key in conversion:
                report.conversion[key] = conversion[key]
                report.forms[key] = sp.form.describe()
    if swaps:
        notes = notes_of(plan)
        # Each seat's band on rows the forward showed (the file's values against the host's).
        notes["accuracy"] = accuracy.bands(
            swaps, record(model, [forward], span_cap=0, source="observed forward"))
        notes["adoption"] = report.summary()
        notes.update(door="adopt_prequantized", measurements=report.measurements())
        report.handle = swap.attach(model, swaps, on_guard_fail=on_guard_fail, notes=notes)
    elif verbose:
        log.warning("[flashrt] adopt: 0 seats, %d refused — host runs unmodified",
                    len(plan.refused))
    return report

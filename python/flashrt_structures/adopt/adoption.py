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

from .. import _core, catalog, seats, swap
from .. import receipt as receipts
from ..autoswap import notes_of
from ..observe import observe
from . import compressed_tensors, gguf
from .source import Source

log = logging.getLogger("flashrt")

FORMATS = ("gguf", "compressed-tensors")


@dataclass
class AdoptionReport:
    """What adopt_prequantized did: the plan (``explain(report)``), the attach handle (ledger,
    summary, detach), and per seat the form adopted and the conversion's max abs difference
    from the host's own weight."""

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


def _check_conversion(sources: dict[str, Source], model: nn.Module, path: str) -> dict[str, float]:
    """Each pack against the host's weight: 0, or the rounding of d*q + m in fp32, in the host
    weight's dtype or in the source's own dequantisation, whichever is coarsest (a bf16 host, or
    bf16 scales, hold d*q rounded to bf16; the seat computes it in fp32). Anything more means the
    host's weights are not this checkpoint's."""
    conversion = {}
    for mpath, src in sources.items():
        if src.pack is None:
            continue
        weight = cast(torch.Tensor, model.get_submodule(mpath).weight).detach()
        stats = src.pack.compare(weight.float() if weight.dtype != torch.float32 else weight)
        err = stats.max_abs_err
        eps = max(src.rounding, torch.finfo(weight.dtype).eps)
        if err > 4 * eps * max(stats.max_abs_ref, 1e-30):
            raise _core.Refused(
                f"adopt: {mpath}.weight differs from {path}'s {src.tensor_name} "
                f"({src.block_type}) by up to {err:.3g}: the host's weights are not this "
                f"checkpoint's")
        conversion[mpath] = float(err)
    return conversion


_READERS: dict[str, Callable[[nn.Module, str | None], dict[str, Source]]] = {
    "gguf": lambda model, source: gguf.sources(model, str(source)),
    "compressed-tensors": compressed_tensors.sources,
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
) -> AdoptionReport:
    """Seats the checkpoint's own quantised blocks on `model` (loaded from that checkpoint).

    source: the checkpoint the model was loaded from: the .gguf file (gguf); the checkpoint
    directory (compressed-tensors), or None when transformers loaded it compressed and the
    modules still carry their packs (read before the first forward decompresses them).
    forward: one real call of the host for the dataflow (default: the model on one token).
    Returns an AdoptionReport; ``explain(report)`` prints the plan, ``report.handle`` is the
    attach handle (ledger, summary, detach)."""
    if fmt not in FORMATS:
        raise ValueError(f"adopt_prequantized: format {fmt!r}; supported: {', '.join(FORMATS)}")
    if source is None and fmt == "gguf":
        raise ValueError("adopt_prequantized(fmt='gguf') needs source=<the .gguf file the model "
                         "was loaded from>")
    sources = _READERS[fmt](model, None if source is None else str(source))
    path = str(source) if source is not None else f"{type(model).__name__}'s modules"
    if forward is None:
        ids = torch.ones((1, 1), dtype=torch.long)
        forward = lambda: model(ids)  # noqa: E731
    weights = [getattr(model.get_submodule(m), "weight", None) for m in sources]
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
    options.source_forms = {m: s.form for m, s in sources.items() if s.form is not None}
    options.source_refusals = {m: s.refusal for m, s in sources.items() if s.refusal}
    plan = _core.plan(graph, catalog.shipped(), options)
    swaps = {}
    for sp in plan.seats:
        adopted = {op: sources[slot.module].pack for op, slot in sp.slots.items()
                   if slot.tensor == "weight" and slot.module in sources
                   and sources[slot.module].pack is not None}
        swaps[sp.site] = seats.build(model, sp, adopted=adopted)
    report = AdoptionReport(fmt, path, plan, None, host=type(model).__name__)
    for sp in plan.seats:
        for slot in sp.slots.values():
            if slot.module in conversion:
                report.conversion[slot.module] = conversion[slot.module]
                report.forms[slot.module] = sp.form.describe()
    if swaps:
        notes = notes_of(plan)
        notes["adoption"] = report.summary()
        notes.update(door="adopt_prequantized", measurements=report.measurements())
        report.handle = swap.attach(model, swaps, on_guard_fail=on_guard_fail, notes=notes)
    elif verbose:
        log.warning("[flashrt] adopt: 0 seats, %d refused — host runs unmodified",
                    len(plan.refused))
    return report

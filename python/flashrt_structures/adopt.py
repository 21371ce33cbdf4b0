"""adopt_prequantized: seat a quantised checkpoint's own blocks instead of requantising the host.

A host loaded from a quantised file (transformers dequantises GGUF to fp32 on load) computes with
the file's values; requantising those costs accuracy a second time. Adoption reads the blocks
from the file, lays them out for the kernels unchanged (``from_quantized``: no rounding), checks
each against the host's own weight (the conversion report: 0, or fp32 rounding of d*q + m), and
seats them through the same plan, explain and ledger as every door. The tensor-name map and the
row permutation are transformers' own (its GGUF loader's), applied to row indices.

Formats: ``gguf`` (Q8_0, Q4_0, Q4_1 blocks; other block types refused by name, per tensor).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from . import _core, catalog, seats, swap
from .autoswap import notes_of
from .observe import observe

log = logging.getLogger("flashrt")

FORMATS = ("gguf",)

# GGUF block types the kernels read as they are: bytes per block of 32 and the form they map to.
_BLOCKS = {
    "Q8_0": (34, _core.WeightFormat.int8_group, True),
    "Q4_0": (18, _core.WeightFormat.int4_group, True),
    "Q4_1": (20, _core.WeightFormat.int4_group, False),
}
_UNQUANTISED = {"F32", "F16", "BF16", "F64"}


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


@dataclass
class _Source:
    """One checkpoint tensor as a module's weight: its form and its unpacked parts."""

    module: str
    tensor_name: str
    block_type: str
    form: _core.WeightForm | None = None
    pack: Any = None  # _core.PackedLinear
    refusal: str = ""


def _form(block_type: str) -> _core.WeightForm:
    _, fmt, symmetric = _BLOCKS[block_type]
    f = _core.WeightForm()
    f.name = "gguf_" + block_type.lower()
    f.format = fmt
    f.group = 32
    f.symmetric = symmetric
    f.scale_dtype = _core.DType.f16
    f.tag = block_type.lower()
    return f


def _unpack_blocks(block_type: str, raw: np.ndarray, n: int, k: int) -> tuple:
    """GGUF blocks of one [n, k] tensor -> (q int8 [n, k], scales f16 [n, k/32], mins or None).
    int4 values come out as nibbles 0..15 with W = q*d + m (Q4_0: m = -8 d)."""
    size = _BLOCKS[block_type][0]
    blocks = np.ascontiguousarray(raw).reshape(n, k // 32, size)
    d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16).reshape(n, k // 32)
    if block_type == "Q8_0":
        q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(n, k)
        return q, d, None
    packed = blocks[..., 4:] if block_type == "Q4_1" else blocks[..., 2:]
    # Byte j of a block holds element j (low nibble) and element j + 16 (high nibble).
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).astype(np.int8).reshape(n, k)
    if block_type == "Q4_1":
        m = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16).reshape(n, k // 32)
    else:
        m = (-8.0 * d.astype(np.float32)).astype(np.float16)
    return q, d, np.ascontiguousarray(m)


def _open_gguf(path: str) -> Any:
    try:
        import gguf
    except ImportError as e:  # pragma: no cover - a missing optional dependency
        raise ImportError("adopt_prequantized(fmt='gguf') needs the gguf package") from e
    p = Path(path)
    if not p.is_file():
        raise _core.Refused(f"adopt: {path}: no such file")
    try:
        return gguf.GGUFReader(str(p))
    except Exception as e:  # the reader raises ValueError, struct errors, IndexError...
        raise _core.Refused(f"adopt: {path}: not a readable GGUF file "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")


def _transformers_map(model: nn.Module, path: str, reader: Any) -> tuple[dict[str, str], Any, dict]:
    """transformers' own GGUF tensor-name map and tensor processor for this host. The processor
    is configured from the host's config (head counts are what its permutation reads)."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as tg

    try:
        arch = tg.read_field(reader, "general.architecture")[0]
    except Exception as e:
        raise _core.Refused(f"adopt: {path}: no general.architecture ({type(e).__name__})")
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type is None:
        raise _core.Refused(f"adopt: {type(model).__name__} has no config.model_type to map "
                            f"{path}'s tensor names")
    config = model.config.to_dict()
    processor = tg.TENSOR_PROCESSORS.get(arch, tg.TensorProcessor)(config=config)
    # Their map recurses through every submodule and rebuilds gguf's name table at each one
    # (~20 ms apiece); the table depends only on (arch, layers), so it is built once here.
    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        name_map = tg.get_gguf_hf_weights_map(model, processor)
    except NotImplementedError as e:
        raise _core.Refused(f"adopt: {path}: {e}")
    finally:
        gguf.get_tensor_name_map = original
    return name_map, processor, {"config": config}


def _row_order(processor: Any, name: str, n: int, name_map: dict, parsed: dict) -> np.ndarray | None:
    """The loader's row permutation of tensor `name`, found by running its processor on row
    indices; None when it does more to the tensor than permute rows."""
    idx = np.arange(n, dtype=np.float64).reshape(n, 1)
    out = processor.process(weights=idx, name=name, tensor_key_mapping=name_map,
                            parsed_parameters=parsed)
    w = np.asarray(out.weights)
    if w.shape != (n, 1):
        return None
    order = w[:, 0]
    if not np.array_equal(np.sort(order), np.arange(n, dtype=np.float64)):
        return None
    return order.astype(np.int64)


def _sources(model: nn.Module, path: str) -> dict[str, _Source]:
    """Each nn.Linear whose weight the file holds: its block type, form and pack."""
    reader = _open_gguf(path)
    name_map, processor, parsed = _transformers_map(model, path, reader)
    linear_of: dict[int, list[str]] = {}
    for mpath, m in model.named_modules():
        if isinstance(m, nn.Linear):
            linear_of.setdefault(id(m.weight), []).append(mpath)
    out: dict[str, _Source] = {}
    matched = 0
    for t in reader.tensors:
        hf_name = name_map.get(t.name)
        if hf_name is None or not hf_name.endswith(".weight"):
            continue
        try:
            param = model.get_parameter(hf_name)
        except AttributeError:
            continue
        modules = linear_of.get(id(param), [])
        if not modules:
            continue  # an embedding or norm: not a seam
        matched += 1
        n, k = param.shape
        btype = t.tensor_type.name
        for mpath in modules:
            src = _Source(mpath, t.name, btype)
            out[mpath] = src
            shape = tuple(int(s) for s in reversed(list(t.shape)))
            if shape != (n, k):
                raise _core.Refused(
                    f"adopt: {path} holds {t.name} as {list(shape)}, the host's {mpath}.weight is "
                    f"{[n, k]}: this file is not the one the model was loaded from")
            if btype in _UNQUANTISED:
                continue
            if btype not in _BLOCKS:
                src.refusal = (f"{t.name} is {btype} blocks; adoptable: "
                               f"{', '.join(_BLOCKS)} (others refused until supported)")
                continue
            order = _row_order(processor, t.name, n, name_map, parsed)
            if order is None:
                src.refusal = (f"{t.name}: transformers' loader transforms it beyond a row "
                               f"permutation; its blocks cannot be adopted as they are")
                continue
            q, d, m = _unpack_blocks(btype, t.data, n, k)
            if not np.array_equal(order, np.arange(n)):
                q, d = q[order], d[order]
                m = m[order] if m is not None else None
            src.form = _form(btype)
            src.pack = _core.from_quantized(src.form.format, 32, np.ascontiguousarray(q),
                                            np.ascontiguousarray(d),
                                            None if m is None else np.ascontiguousarray(m))
    if matched == 0:
        raise _core.Refused(f"adopt: no tensor of {path} names a projection of this "
                            f"{type(model).__name__}: this file is not the one it was loaded from")
    return out


def _check_conversion(sources: dict[str, _Source], model: nn.Module, path: str) -> dict[str, float]:
    """Each pack against the host's weight: 0, or fp32 rounding of d*q + m. Anything more means
    the host's weights are not this file's."""
    conversion = {}
    for mpath, src in sources.items():
        if src.pack is None:
            continue
        stats = src.pack.compare(model.get_submodule(mpath).weight.detach())
        err = stats.max_abs_err
        if err > 4 * np.finfo(np.float32).eps * max(stats.max_abs_ref, 1e-30):
            raise _core.Refused(
                f"adopt: {mpath}.weight differs from {path}'s {src.tensor_name} "
                f"({src.block_type}) by up to {err:.3g}: the host's weights are not this file's")
        conversion[mpath] = float(err)
    return conversion


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

    source: the GGUF file the model was loaded from. forward: one real call of the host for the
    dataflow (default: the model on one token). Returns an AdoptionReport; ``explain(report)``
    prints the plan, ``report.handle`` is the attach handle (ledger, summary, detach)."""
    if fmt not in FORMATS:
        raise ValueError(f"adopt_prequantized: format {fmt!r}; supported: {', '.join(FORMATS)}")
    if source is None:
        raise ValueError("adopt_prequantized(fmt='gguf') needs source=<the .gguf file the model "
                         "was loaded from>")
    path = str(source)
    sources = _sources(model, path)
    conversion = _check_conversion(sources, model, path)
    if forward is None:
        ids = torch.ones((1, 1), dtype=torch.long)
        forward = lambda: model(ids)  # noqa: E731
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
        swaps[sp.site] = seats.build(model, sp, on_guard_fail=on_guard_fail, adopted=adopted)
    report = AdoptionReport(fmt, path, plan, None)
    for sp in plan.seats:
        for slot in sp.slots.values():
            if slot.module in conversion:
                report.conversion[slot.module] = conversion[slot.module]
                report.forms[slot.module] = sp.form.describe()
    if swaps:
        notes = notes_of(plan)
        notes["adoption"] = report.summary()
        report.handle = swap.attach(model, swaps, on_guard_fail=on_guard_fail, notes=notes)
    elif verbose:
        log.warning("[flashrt] adopt: 0 seats, %d refused — host runs unmodified",
                    len(plan.refused))
    return report

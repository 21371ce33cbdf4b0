"""adopt_prequantized: seat a quantised checkpoint's own blocks instead of requantising the host.

A host loaded from a quantised file (transformers dequantises GGUF to fp32 on load) computes with
the file's values; requantising those costs accuracy a second time. Adoption reads the blocks
from the file, lays them out for the kernels unchanged (``from_quantized``: no rounding), checks
each against the host's own weight (the conversion report: 0, or fp32 rounding of d*q + m), and
seats them through the same plan, explain and ledger as every door. The tensor-name map and the
row permutation are transformers' own (its GGUF loader's), applied to row indices.

Formats: ``gguf`` (Q8_0, Q4_0, Q4_1 blocks; other block types refused by name, per tensor) and
``compressed-tensors`` (int4/int8 ``pack-quantized`` and int8 ``int-quantized``, group, channel or
tensor scales; see ``_ct_sources``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from . import _core, catalog, seats, swap
from . import receipt as receipts
from .autoswap import notes_of
from .observe import observe

log = logging.getLogger("flashrt")

FORMATS = ("gguf", "compressed-tensors")

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


@dataclass
class _Source:
    """One checkpoint tensor as a module's weight: its form and its unpacked parts."""

    module: str
    tensor_name: str
    block_type: str
    form: _core.WeightForm | None = None
    pack: Any = None  # _core.PackedLinear
    refusal: str = ""
    # The relative rounding of the source's own dequantisation (compressed-tensors computes
    # (q - zp) * s in the scale's dtype): what the host's copy of d*q may differ by.
    rounding: float = float(np.finfo(np.float32).eps)


def _weight_form(name: str, tag: str, fmt: Any, group: int, symmetric: bool,
                 f16: bool) -> _core.WeightForm:
    """A checkpoint's own form, named for the plan (the catalog's forms are the schemes')."""
    f = _core.WeightForm()
    f.name, f.tag, f.format, f.group, f.symmetric = name, tag, fmt, group, symmetric
    f.scale_dtype = _core.DType.f16 if f16 else _core.DType.f32
    return f


def _form(block_type: str) -> _core.WeightForm:
    _, fmt, symmetric = _BLOCKS[block_type]
    return _weight_form("gguf_" + block_type.lower(), block_type.lower(), fmt, 32, symmetric,
                        f16=True)


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
        first = str(e).splitlines()[0] if str(e) else ""
        raise _core.Refused(f"adopt: {path}: not a readable GGUF file "
                            f"({type(e).__name__}: {first})") from e


def _transformers_map(model: nn.Module, path: str, reader: Any) -> tuple[dict[str, str], Any, dict]:
    """transformers' own GGUF tensor-name map and tensor processor for this host. The processor
    is configured from the host's config (head counts are what its permutation reads)."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as tg

    try:
        arch = tg.read_field(reader, "general.architecture")[0]
    except Exception as e:
        raise _core.Refused(f"adopt: {path}: no general.architecture ({type(e).__name__})") from e
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type is None:
        raise _core.Refused(f"adopt: {type(model).__name__} has no config.model_type to map "
                            f"{path}'s tensor names")
    config = cast(Any, model).config.to_dict()
    processor = tg.TENSOR_PROCESSORS.get(arch, tg.TensorProcessor)(config=config)
    # Their map recurses through every submodule and rebuilds gguf's name table at each one
    # (~20 ms apiece); the table depends only on (arch, layers), so it is built once here.
    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        name_map = tg.get_gguf_hf_weights_map(model, processor)
    except NotImplementedError as e:
        raise _core.Refused(f"adopt: {path}: {e}") from e
    finally:
        gguf.get_tensor_name_map = original
    return name_map, processor, {"config": config}


def _row_order(processor: Any, name: str, n: int, name_map: dict,
               parsed: dict) -> np.ndarray | None:
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


def _gguf_sources(model: nn.Module, path: str) -> dict[str, _Source]:
    """Each nn.Linear whose weight the GGUF file holds: its block type, form and pack."""
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


# compressed-tensors: where the packed values come from. source=<checkpoint dir> reads its
# config.json (quantization_config) and safetensors files; source=None reads the tensors the
# host's own modules carry when transformers loaded the checkpoint compressed (weight_packed,
# weight_scale, weight_zero_point, with the module's quantization_scheme), as it does on CPU
# until the first forward decompresses them. Integer values and zero points come from the
# library's own unpacking (unpack_from_int32); its dequantisation is W = (q - zp) * s.
_CT_PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape",
             "weight_g_idx", "weight")
_CT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")
_KERNEL_GROUPS = (128, 64, 32)


def _ct_checkpoint(path: str) -> tuple[Any, dict[str, dict[str, torch.Tensor]]]:
    """A compressed-tensors checkpoint directory: its QuantizationConfig and, per module prefix,
    the tensors named in _CT_PARTS."""
    import json

    from compressed_tensors.quantization import QuantizationConfig
    from safetensors import safe_open

    d = Path(path)
    cfg_file = d / "config.json"
    if not d.is_dir() or not cfg_file.is_file():
        raise _core.Refused(f"adopt: {path}: no checkpoint directory with a config.json")
    try:
        qc = json.loads(cfg_file.read_text()).get("quantization_config")
    except (OSError, ValueError) as e:
        raise _core.Refused(f"adopt: {path}/config.json is not readable JSON ({e})") from e
    if not isinstance(qc, dict) or qc.get("quant_method") != "compressed-tensors":
        raise _core.Refused(f"adopt: {path}/config.json has no compressed-tensors "
                            f"quantization_config")
    try:
        config = QuantizationConfig.model_validate(qc)
    except Exception as e:  # pydantic's ValidationError
        raise _core.Refused(f"adopt: {path}: its quantization_config does not parse "
                            f"({type(e).__name__}: {str(e).splitlines()[0]})") from e
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise _core.Refused(f"adopt: {path}: no .safetensors files")
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for f in files:
        try:
            with safe_open(str(f), "pt") as st:
                for key in st.keys():
                    prefix, _, leaf = key.rpartition(".")
                    if leaf in _CT_PARTS:
                        parts.setdefault(prefix, {})[leaf] = st.get_tensor(key)
        except Exception as e:  # safetensors raises SafetensorError, OSError...
            first = str(e).splitlines()[0] if str(e) else ""
            raise _core.Refused(f"adopt: {f}: not a readable safetensors file "
                                f"({type(e).__name__}: {first})") from e
    return config, parts


def _ct_scheme(config: Any, mpath: str, module: nn.Module) -> tuple[Any, str] | None:
    """The config group that quantises `module` (the library's own target matching) and its
    compression format; None when the checkpoint leaves it unquantised."""
    from compressed_tensors.utils.match import is_match

    if is_match(mpath, module, config.ignore or []):
        return None
    for scheme in config.config_groups.values():
        if is_match(mpath, module, scheme.targets):
            fmt = scheme.format or config.format
            return scheme, str(getattr(fmt, "value", fmt))
    return None


def _ct_module_parts(model: nn.Module) -> dict[str, tuple[Any, str, dict[str, torch.Tensor]]]:
    """The packs the host's modules carry (transformers' compressed load, before decompression)."""
    out = {}
    for mpath, m in model.named_modules():
        scheme = getattr(m, "quantization_scheme", None)
        if not isinstance(m, nn.Linear) or scheme is None:
            continue
        tensors = {leaf: t.detach() for leaf, t in
                   list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False))
                   if leaf in _CT_PARTS}
        dense = (torch.float32, torch.float16, torch.bfloat16)
        if "weight_packed" in tensors or ("weight" in tensors
                                          and tensors["weight"].dtype not in dense):
            fmt = scheme.format
            out[mpath] = (scheme, str(getattr(fmt, "value", fmt)), tensors)
    return out


def _kernel_group(g: int) -> int:
    """The widest kernel group dividing g (a coarser group's scales repeat exactly), or 0."""
    return next((kg for kg in _KERNEL_GROUPS if g % kg == 0), 0)


def _ct_form(bits: int, group: int, symmetric: bool, f16: bool, what: str) -> _core.WeightForm:
    fmt = {8: "int8_group" if group else "int8_channel", 4: "int4_group"}[bits]
    return _weight_form("ct_" + what, "ct_" + what, getattr(_core.WeightFormat, fmt), group,
                        symmetric, f16)


def _ct_unpack(src: _Source, scheme: Any, fmt: str, t: dict[str, torch.Tensor], n: int,
               k: int) -> None:
    """One module's checkpoint tensors -> src.form and src.pack, or src.refusal naming why not."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    a = scheme.weights
    strategy = str(getattr(a.strategy, "value", a.strategy))
    kind = str(getattr(a.type, "value", a.type))
    sym = "symmetric" if a.symmetric else "asymmetric"
    what = f"{kind}{a.num_bits} {strategy}" + (f" {a.group_size}" if a.group_size else "")
    src.block_type = f"{fmt} {what} {sym}"
    adoptable = ("adoptable: int4/int8 pack-quantized or int8 int-quantized, group, channel or "
                 "tensor scales (int8 symmetric only)")
    if fmt not in _CT_FORMATS or kind != "int" or a.num_bits not in (4, 8):
        src.refusal = f"{src.tensor_name} is {src.block_type}; {adoptable}"
        return
    if strategy not in ("group", "channel", "tensor"):
        src.refusal = f"{src.tensor_name} is {src.block_type}: {strategy} scales; {adoptable}"
        return
    if "weight_g_idx" in t:
        src.refusal = (f"{src.tensor_name} is {src.block_type} with activation ordering "
                       f"(weight_g_idx): its groups are not contiguous columns")
        return
    if a.num_bits == 8 and not a.symmetric:
        src.refusal = (f"{src.tensor_name} is {src.block_type}: the int8 forms carry no zero "
                       f"point; {adoptable}")
        return
    g = int(a.group_size) if strategy == "group" else k
    kg = _kernel_group(g)
    if a.num_bits == 8 and strategy != "group":
        kg = 0  # int8 per channel
    elif kg == 0 or k % g:
        src.refusal = (f"{src.tensor_name} is {src.block_type} over k={k}: no kernel group "
                       f"({', '.join(map(str, _KERNEL_GROUPS))}) divides its group of {g}")
        return
    try:
        if fmt == "pack-quantized":
            q = unpack_from_int32(t["weight_packed"], a.num_bits, torch.Size((n, k)))
        else:
            q = t["weight"]
        scale = t["weight_scale"]
        groups = k // g
        scale = scale.reshape(n, groups) if scale.numel() == n * groups else \
            scale.reshape(1, 1).expand(n, groups)  # a tensor scale, or fails below
        zp = None
        if not a.symmetric:
            zp = t["weight_zero_point"]
            if fmt == "pack-quantized":
                zp = unpack_from_int32(zp, a.num_bits, torch.Size((n, groups)), packed_dim=0)
            zp = zp.reshape(n, groups)
    except (KeyError, RuntimeError, ValueError) as e:
        src.refusal = (f"{src.tensor_name} ({src.block_type}): its tensors do not describe a "
                       f"[{n}, {k}] weight ({type(e).__name__}: {e})")
        return
    if q.dtype != torch.int8 or tuple(q.shape) != (n, k):
        src.refusal = (f"{src.tensor_name} ({src.block_type}): values are {q.dtype} "
                       f"{list(q.shape)}, not int8 [{n}, {k}]")
        return
    # Scales: f16 stays f16 where exact (every int8 group, int4 symmetric: min = -8 s is exact);
    # bf16 widens to f32 exactly; an asymmetric min -(zp + 8) s is formed in f32.
    if scale.is_floating_point():
        src.rounding = max(src.rounding, torch.finfo(scale.dtype).eps)
    f16 = scale.dtype == torch.float16 and kg != 0 and (a.num_bits == 8 or a.symmetric)
    s = scale.to(torch.float16 if f16 else torch.float32)
    rep = g // kg if kg else 1
    s = s.repeat_interleave(rep, dim=1) if kg else s.reshape(n)
    if a.num_bits == 8:
        mins = None
        values = q
    else:
        values = (q.to(torch.int16) + 8).to(torch.int8)  # nibbles: W = (q + 8) s + min
        off = torch.full_like(s, 8.0) if zp is None else \
            (zp.to(torch.float32) + 8).repeat_interleave(rep, dim=1).to(s.dtype)
        mins = -(off * s)
    tag = f"{'int4' if a.num_bits == 4 else 'int8'}_{f'g{kg}' if kg else 'channel'}_" + \
        ("sym" if a.symmetric else "asym")
    src.form = _ct_form(a.num_bits, kg, a.num_bits == 8 or a.symmetric, f16, tag)
    try:
        src.pack = _core.from_quantized(
            src.form.format, kg, np.ascontiguousarray(values.numpy()),
            np.ascontiguousarray(s.numpy()),
            None if mins is None else np.ascontiguousarray(mins.numpy()))
    except ValueError as e:  # values out of range, non-finite scales
        src.form, src.refusal = None, f"{src.tensor_name} ({src.block_type}): {e}"


def _ct_sources(model: nn.Module, source: str | None) -> dict[str, _Source]:
    """Each nn.Linear the compressed-tensors checkpoint quantises: its scheme, form and pack."""
    try:
        import compressed_tensors  # noqa: F401
    except ImportError as e:  # pragma: no cover - a missing optional dependency
        raise ImportError("adopt_prequantized(fmt='compressed-tensors') needs the "
                          "compressed-tensors package") from e
    where = source or f"{type(model).__name__}'s modules"
    if source is None:
        found = _ct_module_parts(model)
        if not found:
            raise ValueError("adopt_prequantized(fmt='compressed-tensors'): the host's modules "
                             "carry no compressed weights (weight_packed); pass source=<the "
                             "checkpoint directory>")
    else:
        config, parts = _ct_checkpoint(source)
        found = {}
        for mpath, m in model.named_modules():
            if isinstance(m, nn.Linear) and mpath in parts:
                hit = _ct_scheme(config, mpath, m)
                if hit is not None:
                    found[mpath] = (*hit, parts[mpath])
        if not found:
            raise _core.Refused(f"adopt: no quantised tensor of {source} names a projection of "
                                f"this {type(model).__name__}: it is not the checkpoint the "
                                f"model was loaded from")
    out: dict[str, _Source] = {}
    for mpath, (scheme, fmt, tensors) in found.items():
        m = cast(Any, model.get_submodule(mpath))
        n, k = m.out_features, m.in_features
        shape = tensors.get("weight_shape")
        if shape is not None and [int(v) for v in shape.tolist()] != [n, k]:
            raise _core.Refused(
                f"adopt: {where} holds {mpath} as {[int(v) for v in shape.tolist()]}, the "
                f"host's {mpath}.weight is {[n, k]}: not the checkpoint the model was loaded from")
        src = _Source(mpath, mpath + ".weight", fmt)
        _ct_unpack(src, scheme, fmt, tensors, n, k)
        out[mpath] = src
    return out


def _check_conversion(sources: dict[str, _Source], model: nn.Module, path: str) -> dict[str, float]:
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


_READERS: dict[str, Callable[[nn.Module, str | None], dict[str, _Source]]] = {
    "gguf": lambda model, source: _gguf_sources(model, str(source)),
    "compressed-tensors": _ct_sources,
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

"""The compressed-tensors reader: each nn.Linear a checkpoint quantises, as a Source.

int4/int8 ``pack-quantized`` and int8 ``int-quantized`` weights with group, channel or tensor
scales; anything else is refused by name, per module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from .. import _core
from .source import Source, weight_form

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
    return weight_form("ct_" + what, "ct_" + what, getattr(_core.WeightFormat, fmt), group,
                       symmetric, f16)


def _ct_unpack(src: Source, scheme: Any, fmt: str, t: dict[str, torch.Tensor], n: int,
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


def sources(model: nn.Module, source: str | None) -> dict[str, Source]:
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
    out: dict[str, Source] = {}
    for mpath, (scheme, fmt, tensors) in found.items():
        m = cast(Any, model.get_submodule(mpath))
        n, k = m.out_features, m.in_features
        shape = tensors.get("weight_shape")
        if shape is not None and [int(v) for v in shape.tolist()] != [n, k]:
            raise _core.Refused(
                f"adopt: {where} holds {mpath} as {[int(v) for v in shape.tolist()]}, the "
                f"host's {mpath}.weight is {[n, k]}: not the checkpoint the model was loaded from")
        src = Source(mpath, mpath + ".weight", fmt)
        _ct_unpack(src, scheme, fmt, tensors, n, k)
        out[mpath] = src
    return out

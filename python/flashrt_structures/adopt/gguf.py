"""The GGUF reader: each nn.Linear whose weight a .gguf file holds, as a Source.

The tensor-name map and the row permutation are transformers' own (its GGUF loader's), applied
to row indices; Q8_0, Q4_0 and Q4_1 blocks are laid out for the kernels unchanged, other block
types are refused by name, per tensor.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, cast

import numpy as np
from torch import nn

from .. import _core
from .source import Source, weight_form

# GGUF block types the kernels read as they are: bytes per block of 32 and the form they map to.
_BLOCKS = {
    "Q8_0": (34, _core.WeightFormat.int8_group, True),
    "Q4_0": (18, _core.WeightFormat.int4_group, True),
    "Q4_1": (20, _core.WeightFormat.int4_group, False),
}
_UNQUANTISED = {"F32", "F16", "BF16", "F64"}


def _form(block_type: str) -> _core.WeightForm:
    _, fmt, symmetric = _BLOCKS[block_type]
    return weight_form("gguf_" + block_type.lower(), block_type.lower(), fmt, 32, symmetric,
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


def sources(model: nn.Module, path: str) -> dict[str, Source]:
    """Each nn.Linear whose weight the GGUF file holds: its block type, form and pack."""
    reader = _open_gguf(path)
    name_map, processor, parsed = _transformers_map(model, path, reader)
    linear_of: dict[int, list[str]] = {}
    for mpath, m in model.named_modules():
        if isinstance(m, nn.Linear):
            linear_of.setdefault(id(m.weight), []).append(mpath)
    out: dict[str, Source] = {}
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
            src = Source(mpath, t.name, btype)
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

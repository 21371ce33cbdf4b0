"""The GGUF reader: each nn.Linear whose weight a .gguf file holds, and each operand of a bank of
routed experts (llama.cpp's ``blk.N.ffn_{gate,up,down}_exps``), as a Source.

The tensor-name map, the row permutation and the placement of expert tensors (gate and up into
the halves of a fused gate_up_proj) are transformers' own (its GGUF loader's), found by running
its tensor processor on row indices; Q8_0, Q4_0 and Q4_1 blocks are laid out for the kernels
unchanged, Q4_K and Q6_K in their own super-block forms, Q5_0 re-expressed exactly (below), other
block types are refused by name, per tensor. With int8 activations the 4-, 5- and 6-bit block
types (Q5_1 and Q5_K only so) are laid out for integer dot products instead (_INT8_ACT).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Literal, NamedTuple, cast

import numpy as np
from torch import nn

from .. import _core
from .source import Source, weight_form


class _Block(NamedTuple):
    """A GGUF block type as adopted: its elements and bytes per block, and the form the kernels
    read it in (format, group, symmetric, f16 scales)."""

    per: int
    size: int
    format: Any
    group: int
    symmetric: bool
    f16: bool


# Q8_0, Q4_0 and Q4_1 are laid out unchanged (f16 scales); the K-quants in their own super-block
# forms: Q4_K as int4_super (the nibbles, the eight 6-bit scale and min codes of each super-block
# of 256, a byte each, and its f16 d and dmin: 4.625 bits a weight against the file's 4.5), Q6_K
# as int8_super (the 6-bit values in bytes, the sixteen int8 scale codes and the f16 d: 8.5625
# against 6.5625). Q5_0 (W = d * (q - 16), q of 5 bits) is re-expressed exactly as int8 g32 with
# the file's d (8.5 bits against 5.5). Every scale the kernels form is a product exact in f32
# (d * sc), and W = scale * q (+ min) is then the product-then-sum gguf's own dequantiser
# computes, bit for bit.
_BLOCKS = {
    "Q8_0": _Block(32, 34, _core.WeightFormat.int8_group, 32, True, True),
    "Q4_0": _Block(32, 18, _core.WeightFormat.int4_group, 32, True, True),
    "Q4_1": _Block(32, 20, _core.WeightFormat.int4_group, 32, False, True),
    "Q5_0": _Block(32, 22, _core.WeightFormat.int8_group, 32, True, True),
    "Q4_K": _Block(256, 144, _core.WeightFormat.int4_super, 32, False, True),
    "Q6_K": _Block(256, 210, _core.WeightFormat.int8_super, 16, True, True),
}
# With int8 activations (adopt_prequantized(..., activations="int8")): the 4-, 5- and 6-bit
# blocks laid out for flashrt/gemm's integer dot products against activation blocks of 32, the
# same values at the file's own bits a weight or near them (Q4_0 and Q4_1 as int4_gemm, Q4_K as
# int4_super_gemm, Q6_K as int6_super_gemm, Q5_0 and Q5_1 as int5_gemm: 5.5 and 6 bits, Q5_K as
# int5_super_gemm: 5.625 against 5.5); Q8_0 keeps its weight-only form. Q5_1 and Q5_K have only
# these forms: with the host's activations they are refused by name.
_INT8_ACT = {
    "Q4_0": _BLOCKS["Q4_0"]._replace(format=_core.WeightFormat.int4_gemm),
    "Q4_1": _BLOCKS["Q4_1"]._replace(format=_core.WeightFormat.int4_gemm),
    "Q4_K": _BLOCKS["Q4_K"]._replace(format=_core.WeightFormat.int4_super_gemm),
    "Q6_K": _BLOCKS["Q6_K"]._replace(format=_core.WeightFormat.int6_super_gemm),
    "Q5_0": _BLOCKS["Q5_0"]._replace(format=_core.WeightFormat.int5_gemm),
    "Q5_1": _Block(32, 24, _core.WeightFormat.int5_gemm, 32, False, True),
    "Q5_K": _Block(256, 176, _core.WeightFormat.int5_super_gemm, 32, False, True),
}
Activations = Literal["host", "int8"]
ACTIVATIONS: tuple[Activations, ...] = ("host", "int8")
_UNQUANTISED = {"F32", "F16", "BF16", "F64"}
# llama.cpp's names of a layer's banks of routed experts: [experts, out, in] in torch order.
_EXPERTS = re.compile(r"blk\.(?P<blk>\d+)\.ffn_(?P<operand>gate|up|down)_exps\.weight")


def _adoptable(block_type: str, activations: str) -> bool:
    return block_type in _BLOCKS or (activations == "int8" and block_type in _INT8_ACT)


def _block(block_type: str, activations: str) -> _Block:
    """How a block type is adopted: its int8-activation form where it has one and was asked
    for, else its weight-only form."""
    if activations == "int8" and block_type in _INT8_ACT:
        return _INT8_ACT[block_type]
    return _BLOCKS[block_type]


def _form(block_type: str, activations: str) -> _core.WeightForm:
    b = _block(block_type, activations)
    a8 = "_a8" if b.format in {f.format for f in _INT8_ACT.values()} else ""
    return weight_form(f"gguf_{block_type.lower()}{a8}", f"{block_type.lower()}{a8}", b.format,
                       b.group, b.symmetric, f16=b.f16)


class _Parts(NamedTuple):
    """One [n, k] tensor's values as from_quantized takes them (rows in the file's order)."""

    q: np.ndarray
    scales: np.ndarray
    mins: np.ndarray | None = None
    super_scales: np.ndarray | None = None
    super_mins: np.ndarray | None = None

    def rows(self, order: np.ndarray | None) -> _Parts:
        """The parts with their rows in `order` (None: as they are), each C-contiguous."""
        def take(a: np.ndarray | None) -> np.ndarray | None:
            if a is None:
                return None
            return np.ascontiguousarray(a if order is None else a[order])
        q, scales = take(self.q), take(self.scales)
        assert q is not None and scales is not None
        return _Parts(q, scales, take(self.mins), take(self.super_scales), take(self.super_mins))


def _q4_k(blocks: np.ndarray, n: int, k: int) -> _Parts:
    """Q4_K super-blocks [n, k/256, 144] (or Q5_K's [n, k/256, 176], its 32 bytes of fifth bits
    before the nibbles) -> nibbles [n, k], scale and min codes uint8 [n, k/32], d and dmin f16
    [n, k/256]."""
    d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16).reshape(n, k // 256)
    dmin = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16).reshape(n, k // 256)
    packed = blocks[..., 4:16].astype(np.uint8)  # 12 bytes: eight 6-bit scales and mins
    lo, hi = packed[..., 0:4], packed[..., 4:8]
    tail = packed[..., 8:12]
    # Sub-blocks 0..3 keep their scale and min in the low 6 bits of bytes 0..3 and 4..7;
    # 4..7 take a nibble of bytes 8..11 and the top 2 bits of bytes 0..3 (scale) or 4..7 (min).
    sc = np.concatenate([lo & 63, (tail & 15) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([hi & 63, (tail >> 4) | ((hi >> 6) << 4)], axis=-1)
    # 128 bytes of values: four runs of 32 bytes, run r holding sub-block 2r in its low nibbles
    # and sub-block 2r + 1 in its high nibbles.
    qs = blocks[..., -128:].reshape(n, k // 256, 4, 1, 32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=3).astype(np.int8).reshape(n, k)
    return _Parts(q, sc.reshape(n, k // 32), mn.reshape(n, k // 32), d, dmin)


def _q5_k(blocks: np.ndarray, n: int, k: int) -> _Parts:
    """Q5_K super-blocks [n, k/256, 176] -> values 0..31 [n, k] and Q4_K's codes: bit s of
    byte l of the 32 bytes after the codes is sub-block s's element l's fifth bit."""
    parts = _q4_k(blocks, n, k)
    qh = blocks[..., 16:48].reshape(n, k // 256, 1, 32)
    fifth = (qh >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
    return parts._replace(q=parts.q | (fifth.astype(np.int8).reshape(n, k) << 4))


def _q6_k(blocks: np.ndarray, n: int, k: int) -> _Parts:
    """Q6_K super-blocks [n, k/256, 210] -> q int8 [n, k] in -32..31, scale codes int8
    [n, k/16], d f16 [n, k/256]."""
    nb = k // 256
    # Each half of 128 values: 64 bytes of low nibbles (values 0..63 low, then 64..127 high)
    # and 32 bytes holding four values' top two bits each (bits 2t..2t+1: value 32t + l).
    ql = blocks[..., 0:128].reshape(n, nb, 2, 64)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=-1)
    qh = blocks[..., 128:192].reshape(n, nb, 2, 1, 32)
    high = ((qh >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(4, 1)) & 3).reshape(n, nb, 2, 128)
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)
    sc = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).reshape(n, k // 16)
    d = np.ascontiguousarray(blocks[..., 208:210]).view(np.float16).reshape(n, nb)
    return _Parts(q.reshape(n, k), sc, None, d)


def _unpack_blocks(block_type: str, raw: np.ndarray, n: int, k: int) -> _Parts:
    """GGUF blocks of one [n, k] tensor -> q int8 [n, k], scales f16 [n, k/group], mins or None
    (the K-quants: codes and super scales, above). int4 values come out as nibbles 0..15 with
    W = q*d + m (Q4_0: m = -8 d); Q5_1's values 0..31 with its d and m."""
    b = _BLOCKS.get(block_type) or _INT8_ACT[block_type]
    blocks = np.ascontiguousarray(raw).reshape(n, k // b.per, b.size)
    if block_type == "Q4_K":
        return _q4_k(blocks, n, k)
    if block_type == "Q5_K":
        return _q5_k(blocks, n, k)
    if block_type == "Q6_K":
        return _q6_k(blocks, n, k)
    if block_type == "Q5_1":  # d, m, 32 fifth bits (little-endian), 16 bytes of nibbles
        d, m = (np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16).reshape(n, k // 32)
                for at in (0, 2))
        high = np.unpackbits(blocks[..., 4:8], axis=-1, bitorder="little")
        packed = blocks[..., 8:]
        low = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)
        return _Parts((low | (high << 4)).astype(np.int8).reshape(n, k), d, m)
    d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16).reshape(n, k // 32)
    if block_type == "Q8_0":
        q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(n, k)
        return _Parts(q, d)
    if block_type == "Q5_0":  # d, 32 fifth bits (little-endian), 16 bytes of nibbles
        high = np.unpackbits(blocks[..., 2:6], axis=-1, bitorder="little")
        packed = blocks[..., 6:]
        low = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)
        q = (low | (high << 4)).astype(np.int8) - np.int8(16)
        return _Parts(q.reshape(n, k), d)
    packed = blocks[..., 4:] if block_type == "Q4_1" else blocks[..., 2:]
    # Byte j of a block holds element j (low nibble) and element j + 16 (high nibble).
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).astype(np.int8).reshape(n, k)
    if block_type == "Q4_1":
        m = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16).reshape(n, k // 32)
    else:
        m = (-8.0 * d.astype(np.float32)).astype(np.float16)
    return _Parts(q, d, np.ascontiguousarray(m))


def _pack(block_type: str, raw: np.ndarray, n: int, k: int, order: np.ndarray,
          activations: str) -> Any:
    """One [n, k] tensor's blocks laid out for the kernels, its rows in the host's order."""
    parts = _unpack_blocks(block_type, raw, n, k)
    parts = parts.rows(None if np.array_equal(order, np.arange(n)) else order)
    b = _block(block_type, activations)
    if block_type == "Q5_0" and b.format == _core.WeightFormat.int5_gemm:
        parts = parts._replace(q=parts.q + np.int8(16))  # int5_gemm holds u = q + 16, 0..31
    return _core.from_quantized(b.format, b.group, parts.q, parts.scales, parts.mins,
                                super_scales=parts.super_scales, super_mins=parts.super_mins)


def _refusal(name: str, block_type: str, activations: str) -> str:
    if block_type in _INT8_ACT:  # only with int8 activations
        return (f"{name} is {block_type} blocks; no weight-only form reads them: adopted with "
                f"activations='int8' ({_INT8_ACT[block_type].format.name})")
    adoptable = sorted(set(_BLOCKS) | (set(_INT8_ACT) if activations == "int8" else set()))
    return (f"{name} is {block_type} blocks; adoptable: {', '.join(adoptable)} (others refused "
            f"until supported)")


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


def _loaded_shape(processor: Any, name: str, shape: tuple, name_map: dict) -> tuple:
    """The shape transformers' loader gives tensor `name` of the file's `shape` (a reshape, as
    for Qwen2-MoE's shared-expert gate, held 1-D in the file)."""
    try:
        out = processor.process(weights=np.zeros(shape, np.float32), name=name,
                                tensor_key_mapping=name_map, parsed_parameters={"tensors": {}})
    except (KeyError, ValueError, RuntimeError):
        return shape
    return tuple(np.shape(out.weights))


def _placement(processor: Any, name: str, shape: tuple, name_map: dict) -> tuple | None:
    """Where transformers' loader puts expert tensor `name` ([experts, out, in] in the file),
    found by running its processor on row numbers 1.. as the loader runs it on the tensor: the
    host tensor's name and the row numbers it received, [experts, rows] (0 where another tensor's
    rows go; None when the loader reshapes beyond rows), or None when the loader puts the tensor
    on no tensor of this host."""
    e, f, _ = shape
    rows = np.arange(1, e * f + 1, dtype=np.float64).reshape(e, f, 1)
    parsed: dict[str, dict] = {"tensors": {}}
    try:
        out = processor.process(weights=rows, name=name, tensor_key_mapping=name_map,
                                parsed_parameters=parsed)
    except KeyError:  # its map has no entry for the tensor's layer
        return None
    if out.name is None and len(parsed["tensors"]) == 1:  # merged into a host tensor
        ((hf_name, placed),) = parsed["tensors"].items()
        placed = placed.numpy() if hasattr(placed, "numpy") else np.asarray(placed)
    elif out.name is not None and out.name in name_map:
        hf_name, placed = name_map[out.name], np.asarray(out.weights)
    else:
        return None
    if placed.ndim != 3 or placed.shape[2] != 1:
        return hf_name, None
    return hf_name, placed[:, :, 0]


def _bank_rows(placed: np.ndarray | None, e: int, f: int) -> tuple[int, int, np.ndarray] | None:
    """The loader's placement as (part, parts, row order): every expert's f rows land as one
    part'th slice of `parts` along the host tensor's second dimension, in the same expert, in
    `order`; None when it does anything else."""
    if placed is None or placed.shape[0] != e or placed.shape[1] % f:
        return None
    parts = placed.shape[1] // f
    where = np.flatnonzero(placed[0])
    if len(where) != f or where[0] % f or where[-1] != where[0] + f - 1:
        return None
    part = int(where[0] // f)
    got = placed[:, part * f:(part + 1) * f].astype(np.int64) - 1
    if np.count_nonzero(placed) != e * f or not np.array_equal(got // f, np.repeat(
            np.arange(e)[:, None], f, axis=1)):
        return None
    order = got[0] % f
    if not np.array_equal(np.sort(order), np.arange(f)) or not np.array_equal(
            got % f, np.broadcast_to(order, got.shape)):
        return None
    return part, parts, order


def _bank_source(model: nn.Module, t: Any, operand: str, blk: str, processor: Any,
                 name_map: dict, path: str, activations: str) -> Source | None:
    """One expert tensor of the file as the operand of the host's bank it fills: the form and a
    pack per expert, or the refusal; None when the loader puts it on no tensor of this host."""
    shape = tuple(int(s) for s in reversed(list(t.shape)))
    btype = t.tensor_type.name
    if len(shape) != 3:
        raise _core.Refused(f"adopt: {path} holds {t.name} as {list(shape)}, not a bank "
                            f"[experts, out, in]: this file is not one transformers loads")
    e, f, k = shape
    where = _placement(processor, t.name, shape, name_map)
    if where is None:
        return None
    hf_name, placed = where
    mpath, _, leaf = hf_name.rpartition(".")
    try:
        param = model.get_parameter(hf_name)
    except AttributeError:
        return None
    src = Source(mpath, t.name, btype, operand=operand, tensor=leaf)
    rows = _bank_rows(placed, e, f)
    host = list(param.shape)
    if placed is not None and (param.dim() != 3 or host != [e, placed.shape[1], k]):
        raise _core.Refused(
            f"adopt: {path} holds {t.name} as {list(shape)}, which transformers' loader makes "
            f"{[e, placed.shape[1], k]}; the host's {hf_name} is {host}: this file is not the "
            f"one the model was loaded from")
    if rows is None:
        src.refusal = (f"{t.name}: transformers' loader places it beyond a slice of "
                       f"{hf_name} per expert; its blocks cannot be adopted as they are")
        return src
    src.part, src.parts, order = rows
    if btype in _UNQUANTISED:
        return src
    if not _adoptable(btype, activations):
        src.refusal = _refusal(t.name, btype, activations)
        return src
    data = np.asarray(t.data).reshape(e, f, -1)
    src.form = _form(btype, activations)
    src.packs = [_pack(btype, data[x], f, k, order, activations) for x in range(e)]
    return src


def _unplaced(unplaced: list[tuple[Any, str, str]], name_map: dict, processor: Any,
              model: nn.Module, path: str, out: dict[str, Source]) -> None:
    """Expert tensors transformers' loader puts on no tensor of the host: named as refusals of
    the bank their layer's map entries point to (OLMoE: down mapped, gate and up not), or, where
    the host has no bank there, the file refused."""
    loader = type(processor).__name__
    for t, operand, blk in unplaced:
        module = next((out[k].module for k in out if out[k].operand and
                       out[k].tensor_name.startswith(f"blk.{blk}.")), None)
        for o in ("gate", "up", "down"):
            hf = name_map.get(f"blk.{blk}.ffn_{o}_exps") or name_map.get(
                f"blk.{blk}.ffn_{o}_exps.weight")
            if module is None and hf is not None:
                module = hf.rpartition(".")[0]
        if module is None:
            raise _core.Refused(f"adopt: {path} holds {t.name}, a bank of experts; transformers' "
                                f"GGUF map puts it on no tensor of this {type(model).__name__}: "
                                f"this file is not the one the model was loaded from")
        src = Source(module, t.name, t.tensor_type.name, operand=operand)
        src.refusal = (f"{t.name}: transformers' GGUF loader ({loader}) puts it on no tensor of "
                       f"this {type(model).__name__}; the bank's blocks have no path onto it")
        out.setdefault(src.key, src)


def sources(model: nn.Module, path: str,
            activations: Activations = "host") -> dict[str, Source]:
    """Each nn.Linear whose weight the GGUF file holds, and each bank operand (by Source.key):
    its block type, form and pack (or packs); with activations "int8" the 4-, 5- and 6-bit
    block types in their integer-dot forms (_INT8_ACT)."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"adopt: activations {activations!r}; supported: "
                         f"{', '.join(ACTIVATIONS)}")
    reader = _open_gguf(path)
    name_map, processor, parsed = _transformers_map(model, path, reader)
    linear_of: dict[int, list[str]] = {}
    for mpath, m in model.named_modules():
        if isinstance(m, nn.Linear):
            linear_of.setdefault(id(m.weight), []).append(mpath)
    out: dict[str, Source] = {}
    unplaced: list[tuple[Any, str, str]] = []
    matched = 0
    for t in reader.tensors:
        if bank := _EXPERTS.fullmatch(t.name):
            src = _bank_source(model, t, bank["operand"], bank["blk"], processor, name_map, path,
                               activations)
            if src is None:
                unplaced.append((t, bank["operand"], bank["blk"]))
            else:
                matched += 1
                out[src.key] = src
            continue
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
            if shape != (n, k) and btype in _UNQUANTISED and _loaded_shape(
                    processor, t.name, shape, name_map) == (n, k):
                continue  # reshaped by the loader (a 1-D gate), unquantised: with the host
            if shape != (n, k):
                raise _core.Refused(
                    f"adopt: {path} holds {t.name} as {list(shape)}, the host's {mpath}.weight is "
                    f"{[n, k]}: this file is not the one the model was loaded from")
            if btype in _UNQUANTISED:
                continue
            if not _adoptable(btype, activations):
                src.refusal = _refusal(t.name, btype, activations)
                continue
            order = _row_order(processor, t.name, n, name_map, parsed)
            if order is None:
                src.refusal = (f"{t.name}: transformers' loader transforms it beyond a row "
                               f"permutation; its blocks cannot be adopted as they are")
                continue
            src.form = _form(btype, activations)
            src.pack = _pack(btype, t.data, n, k, order, activations)
    _unplaced(unplaced, name_map, processor, model, path, out)
    if matched == 0:
        raise _core.Refused(f"adopt: no tensor of {path} names a projection of this "
                            f"{type(model).__name__}: this file is not the one it was loaded from")
    return out

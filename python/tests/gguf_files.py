"""GGUF checkpoints written the way llama.cpp's converter writes them, for adoption tests.
Block types gguf can quantise to are its quantiser's; Q4_K and Q6_K, which it only dequantises,
are random valid super-blocks at the weights' scale.

The file's tensors are the host's projections quantised by gguf's own quantisers, named by
transformers' own tensor-name map, with q/k rows in the file's order (the inverse of the row
permutation transformers' loader applies). A bank of routed experts is written as llama.cpp
writes it: blk.N.ffn_gate_exps / ffn_up_exps [experts, F, D] (the halves of the host's fused
gate_up_proj) and ffn_down_exps [experts, D, F]; routers and Qwen2-MoE's shared-expert gate
(1-D) stay F32, as llama.cpp's converter keeps them. The host's weights are then set to what the
loader would produce from the file (gguf's dequantiser, then the loader's processor, which merges
gate and up back into gate_up_proj), so host and file are the same model, as after
`from_pretrained(gguf_file=...)`. `adopted` writes such a file and adopts it for the length of a
`with` block.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import torch
from torch import nn
from transformers import modeling_gguf_pytorch_utils as tg

ARCH = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe",
        "olmoe": "olmoe", "gemma3_text": "gemma3"}
# Routers and the shared-expert gate: F32 in llama.cpp's files whatever the file's type.
_F32 = re.compile(r"blk\.\d+\.ffn_gate_inp(_shexp)?\.weight")
_BANK = re.compile(r"blk\.\d+\.ffn_(gate|up|down)_exps")


def _k_quant_blocks(rows: np.ndarray, qt) -> np.ndarray:
    """Q4_K, Q5_K, Q6_K or Q2_K blocks for `rows` [..., k] (k a multiple of 256), which gguf has no
    quantiser
    for: random valid super-blocks (any bytes with finite f16 scales are one) scaled to each
    row's magnitude, so the file's dequantised weights are in the host's range."""
    lead, k = rows.shape[:-1], rows.shape[-1]
    rng = np.random.default_rng(int(k) * 7 + rows.size)
    amax = np.abs(rows).max(axis=-1, keepdims=True).astype(np.float32)[..., None]
    def f16(v: np.ndarray) -> np.ndarray:  # one f16 per super-block, as its two bytes
        return np.broadcast_to(v, (*lead, k // 256, 1)).astype(np.float16).view(np.uint8)

    if qt == gguf.GGMLQuantizationType.Q4_K:  # W = d*sc*q - dmin*m in [-amax/2, amax]
        blocks = rng.integers(0, 256, size=(*lead, k // 256, 144), dtype=np.uint8)
        blocks[..., 0:2], blocks[..., 2:4] = f16(amax / (15 * 63)), f16(amax / (63 * 2))
    elif qt == gguf.GGMLQuantizationType.Q6_K:  # W = d*sc*q, |W| <= amax
        blocks = rng.integers(0, 256, size=(*lead, k // 256, 210), dtype=np.uint8)
        blocks[..., 208:210] = f16(amax / (128 * 32))
    elif qt == gguf.GGMLQuantizationType.Q5_K:  # W = d*sc*q - dmin*m, q of 5 bits
        blocks = rng.integers(0, 256, size=(*lead, k // 256, 176), dtype=np.uint8)
        blocks[..., 0:2], blocks[..., 2:4] = f16(amax / (31 * 63)), f16(amax / (63 * 2))
    elif qt == gguf.GGMLQuantizationType.Q2_K:  # d and dmin last: W = d*sc*q - dmin*m
        blocks = rng.integers(0, 256, size=(*lead, k // 256, 84), dtype=np.uint8)
        blocks[..., 80:82], blocks[..., 82:84] = f16(amax / (3 * 15)), f16(amax / (15 * 2))
    else:
        raise NotImplementedError(f"no test blocks for {qt.name}")
    return blocks.reshape(*lead, k // 256 * blocks.shape[-1])


def _quantize(rows: np.ndarray, qt) -> np.ndarray:
    """gguf's own quantiser, or test blocks for the types it only dequantises."""
    try:
        return gguf.quants.quantize(np.ascontiguousarray(rows), qt)
    except NotImplementedError:
        return _k_quant_blocks(np.ascontiguousarray(rows), qt)


def _processor(model: nn.Module, arch: str):
    return tg.TENSOR_PROCESSORS.get(arch, tg.TensorProcessor)(config=model.config.to_dict())


def name_map(model: nn.Module, arch: str) -> dict[str, str]:
    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        return tg.get_gguf_hf_weights_map(model, _processor(model, arch))
    finally:
        gguf.get_tensor_name_map = original


def write(model: nn.Module, path: Path, qtype: str | dict[str, str], *,
          load_into_host: bool = True) -> Path:
    """Writes every nn.Linear weight of `model` to a GGUF file at `path` in block type qtype
    (one name for all, or {gguf tensor name: type} with a default under "*"), and sets the host's
    weights to what transformers' loader would read back."""
    arch = ARCH[model.config.model_type]
    processor = _processor(model, arch)
    g2h = name_map(model, arch)
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(model.config.num_hidden_layers)
    loaded = {}
    parsed: dict[str, dict] = {"tensors": {}}  # where the loader merges expert tensors
    for gname, hname in sorted(g2h.items()):
        param = model.get_parameter(hname)
        if _F32.fullmatch(gname):
            writer.add_tensor(gname, param.detach().float().numpy().squeeze(0)
                              if param.shape[0] == 1 else param.detach().float().numpy())
            continue
        if bank := _BANK.fullmatch(gname):
            fname = gname + ".weight"
            kind = qtype if isinstance(qtype, str) else qtype.get(fname, qtype["*"])
            qt = gguf.GGMLQuantizationType[kind]
            host = param.detach().float().numpy()
            half = host.shape[1] // 2
            rows = {"gate": host[:, :half], "up": host[:, half:], "down": host}[bank[1]]
            data = _quantize(rows, qt)
            writer.add_tensor(fname, data, raw_dtype=qt)
            back = gguf.quants.dequantize(data, qt)
            processor.process(weights=back, name=fname, tensor_key_mapping=g2h,
                              parsed_parameters=parsed)
            continue
        if id(param) not in linear_weights or gname in loaded:
            continue
        kind = qtype if isinstance(qtype, str) else qtype.get(gname, qtype["*"])
        qt = gguf.GGMLQuantizationType[kind]
        n = param.shape[0]
        # The file's row order: the inverse of the loader's permutation (found on row indices).
        order = processor.process(weights=np.arange(n, dtype=np.float64).reshape(n, 1),
                                  name=gname, tensor_key_mapping=g2h,
                                  parsed_parameters={}).weights[:, 0].astype(np.int64)
        file_rows = param.detach().float().numpy()[np.argsort(order)]
        data = _quantize(file_rows, qt)
        writer.add_tensor(gname, data, raw_dtype=qt)
        back = gguf.quants.dequantize(data, qt)
        loaded[gname] = (hname, processor.process(weights=back, name=gname,
                                                  tensor_key_mapping=g2h,
                                                  parsed_parameters={}).weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if load_into_host:
        with torch.no_grad():
            for hname, values in loaded.values():
                model.get_parameter(hname).copy_(torch.from_numpy(np.ascontiguousarray(values)))
            for hname, merged in parsed["tensors"].items():
                model.get_parameter(hname).copy_(merged)
    return path


@contextlib.contextmanager
def adopted(model: nn.Module, folder: Path, qtype: str | dict[str, str]) -> Iterator:
    """adopt_prequantized on `model`'s GGUF file in block type qtype (as `write`, in `folder`):
    the AdoptionReport for the block, whose attach is detached on leaving it."""
    import flashrt_structures as S

    report = S.adopt_prequantized(model, "gguf", write(model, folder / "m.gguf", qtype))
    try:
        yield report
    finally:
        report.handle.detach()

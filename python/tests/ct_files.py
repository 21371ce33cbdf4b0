"""compressed-tensors checkpoints made by the compressed-tensors library itself, for adoption
tests: its quantisation config applied to a copy of the host, its own qparams
(calculate_qparams over each group's or channel's min and max), its ModelCompressor to pack and
write the checkpoint. The host's weights are then set to what transformers' loader decompresses
from that checkpoint, so host and checkpoint are the same model.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    QuantizationStrategy,
    apply_quantization_config,
)
from compressed_tensors.quantization.utils.helpers import calculate_qparams
from torch import nn
from transformers import AutoModelForCausalLM

# The schemes the tests write: the library's QuantizationArgs fields.
INT4_GROUP_SYM = dict(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32)
INT4_GROUP_ASYM = dict(num_bits=4, type="int", symmetric=False, strategy="group", group_size=128)
INT4_CHANNEL_SYM = dict(num_bits=4, type="int", symmetric=True, strategy="channel")
INT8_CHANNEL_SYM = dict(num_bits=8, type="int", symmetric=True, strategy="channel")
INT8_GROUP_SYM = dict(num_bits=8, type="int", symmetric=True, strategy="group", group_size=64)
INT8_TENSOR_SYM = dict(num_bits=8, type="int", symmetric=True, strategy="tensor")
INT8_CHANNEL_ASYM = dict(num_bits=8, type="int", symmetric=False, strategy="channel")
FP8_CHANNEL = dict(num_bits=8, type="float", symmetric=True, strategy="channel")


def _calibrate(model: nn.Module) -> None:
    """Each quantised module's weight scale and zero point from its own min and max."""
    for _, m in model.named_modules():
        scheme = getattr(m, "quantization_scheme", None)
        if scheme is None or scheme.weights is None:
            continue
        args, w = scheme.weights, m.weight.detach()
        if args.strategy == QuantizationStrategy.GROUP:
            w = w.unflatten(-1, (w.shape[-1] // args.group_size, args.group_size))
            lo, hi = w.amin(-1), w.amax(-1)
        elif args.strategy == QuantizationStrategy.TENSOR:
            lo, hi = w.amin().reshape(1), w.amax().reshape(1)
        else:
            lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        scale, zp = calculate_qparams(lo, hi, args)
        m.weight_scale.data.copy_(scale.to(m.weight_scale.dtype))
        if hasattr(m, "weight_zero_point"):
            m.weight_zero_point.data.copy_(zp.to(m.weight_zero_point.dtype))


def write(model: nn.Module, out: Path, weights: dict | dict[str, dict], *,
          fmt: str | None = None, ignore: tuple[str, ...] = ("lm_head",),
          dtype: torch.dtype | None = None, load_into_host: bool = True) -> Path:
    """Writes `model` quantised with `weights` (QuantizationArgs fields for every Linear, or
    {target: fields} for several config groups; targets are the library's: class names or
    're:' patterns) as a compressed-tensors checkpoint in directory `out`, compressed in format
    `fmt` (None: the library's inferred format), and sets the host's weights to the values the
    library decompresses from it (what transformers' loader computes on the first forward).
    dtype: the checkpoint's (torch.bfloat16: bf16 weights, so bf16 scales; None: the host's)."""
    groups = weights if all(isinstance(v, dict) for v in weights.values()) else {"Linear": weights}
    config = QuantizationConfig(
        config_groups={f"group_{i}": QuantizationScheme(targets=[t], weights=QuantizationArgs(**a))
                       for i, (t, a) in enumerate(groups.items())},
        ignore=list(ignore))
    q = copy.deepcopy(model)
    if dtype is not None:
        q = q.to(dtype)
    apply_quantization_config(q, config)
    _calibrate(q)
    compressor = ModelCompressor.from_pretrained_model(q, fmt)
    compressor.compress_model(q)
    q.save_pretrained(out)
    compressor.update_config(out)
    if load_into_host:
        compressor.decompress_model(q)  # the library's own decompression of what it wrote
        dense = q.state_dict()
        with torch.no_grad():
            for k, v in model.state_dict().items():
                v.copy_(dense[k])
    return out


def load(path: Path) -> nn.Module:
    """The checkpoint as transformers loads it on CPU: modules carrying their packs until the
    first forward decompresses them."""
    return AutoModelForCausalLM.from_pretrained(path).eval()

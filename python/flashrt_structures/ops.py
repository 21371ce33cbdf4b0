"""Kernel ops on torch tensors: pack a weight once, then run decode-row linears and FFNs.

The door allocates outputs with torch and hands the core zero-copy views; a form the kernels do
not take (non-contiguous rows, a dtype, rows outside the decode band) raises ``Refused`` naming
it rather than being copied into shape.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import torch

from . import _core

PackedLinear: TypeAlias = _core.PackedLinear
Activation = Literal["silu", "gelu_tanh"]


def weight_pages(settle: bool = False) -> dict[str, int | bool]:
    """Where this process's packed weights lie: the huge-page arena's mapped bytes, its resident
    bytes and how many of them the kernel backs with huge pages (/proc/self/smaps; `known` False
    where it cannot be read or the arena is off). settle=True first asks the kernel to collapse
    the resident small pages into huge ones (Note [Weights in huge pages])."""
    p = _core.settle_weight_memory() if settle else _core.weight_memory_pages()
    return {"known": p.known, "arena_bytes": p.arena_bytes, "resident_bytes": p.resident_bytes,
            "huge_bytes": p.huge_bytes}


def pack_int8(weight: torch.Tensor, group: int = 0, scales: str = "f32") -> PackedLinear:
    """Weight-only int8: one scale per output channel (group 0) or per group of 32/64/128 of k,
    group scales in f32 or f16. weight: [n, k] f32/bf16 (any strides)."""
    return _core.pack_int8(weight.detach(), group, scales)


def pack_int8_gemm(weight: torch.Tensor, act_block: int = 0) -> PackedLinear:
    """int8 per output channel in the w8a8 GEMM's layout: linear() then quantizes the activation
    rows at run time (per row, or per block of `act_block` = 32 inputs: the decode form) and runs
    flashrt/gemm, for any number of rows."""
    return _core.pack_int8_gemm(weight.detach(), act_block)


def pack_int4_gemm(weight: torch.Tensor, symmetric: bool = True) -> PackedLinear:
    """int4 in groups of 32 (f16 scales; a min per group when not symmetric) in the integer
    GEMM's layout: linear() quantizes activations per block of 32 at run time and runs
    flashrt/gemm (the w4a8 decode form). k must be a multiple of 32."""
    return _core.pack_int4_gemm(weight.detach(), symmetric)


def pack_int4(
    weight: torch.Tensor, group: int = 32, symmetric: bool = True, scales: str = "f32"
) -> PackedLinear:
    """Weight-only int4 with one scale and one min per group of k (W = q*scale + min)."""
    return _core.pack_int4(weight.detach(), group, symmetric, scales)


def pack_int4_super(weight: torch.Tensor) -> PackedLinear:
    """Weight-only int4 in super-blocks of 256 (GGUF Q4_K's form): a min-max grid per group of
    32 inputs whose scale and offset are 6-bit codes under the super-block's f16 d and dmin."""
    return _core.pack_int4_super(weight.detach())


def pack_int4_super_gemm(weight: torch.Tensor) -> PackedLinear:
    """pack_int4_super's values laid out for flashrt/gemm's integer dot products (the w4a8 decode
    form): linear() then quantizes the activations per block of 32. k must be a multiple of
    256."""
    return _core.pack_int4_super_gemm(weight.detach())


def pack_int6_super_gemm(weight: torch.Tensor) -> PackedLinear:
    """pack_int8_super's values (GGUF Q6_K's form, -32..31) in six bits, laid out for flashrt/gemm's
    integer dot products against activation blocks of 32: 6.5625 bits a weight. k must be a
    multiple of 256."""
    return _core.pack_int6_super_gemm(weight.detach())


def pack_int8_super(weight: torch.Tensor) -> PackedLinear:
    """Weight-only int8 in super-blocks of 256 (GGUF Q6_K's form): a symmetric 6-bit grid per
    group of 16 inputs whose scale is an int8 code under the super-block's f16 d."""
    return _core.pack_int8_super(weight.detach())


def _out(x: torch.Tensor, n: int, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        out = torch.empty((x.shape[0], n), dtype=x.dtype)
    return out


def linear(
    x: torch.Tensor,
    w: PackedLinear,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    threads: int = 0,
) -> torch.Tensor:
    """y = x @ dequant(w).T (+ bias) for x [m, k] with 1 <= m <= 16 (flashrt/linear), or any
    m for a pack_int8_gemm / pack_int4_gemm / pack_int4_super_gemm / pack_int6_super_gemm
    weight (flashrt/gemm, activations quantized at run time)."""
    y = _out(x, w.n, out)
    b = None if bias is None else bias.detach()
    _core.linear(x.detach(), w, b, y, threads)
    return y


def ffn(
    x: torch.Tensor,
    gate: PackedLinear,
    up: PackedLinear,
    down: PackedLinear,
    act: Activation = "silu",
    *,
    out: torch.Tensor | None = None,
    threads: int = 0,
) -> torch.Tensor:
    """y = down(act(gate(x)) * up(x)), fused, for x [m, hidden] with 1 <= m <= 16."""
    y = _out(x, down.n, out)
    _core.ffn(x.detach(), gate, up, down, act, y, threads)
    return y


def linear_refusal(x: torch.Tensor, w: PackedLinear, out: torch.Tensor) -> str:
    """'' when linear() takes this call, else the reason."""
    return _core.linear_refusal(x.detach(), w, out)


def sequence_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
    threads: int = 0,
) -> torch.Tensor:
    """softmax(scale q k^T) v, unmasked, on flashrt/gemm's sequence_attention (kernel ABI 4.9).

    q [batch, heads, q_len, head_dim], k and v [batch, kv_heads, kv_len, head_dim], bf16 with
    head_dim contiguous (torch's scaled_dot_product_attention layout, any other strides); scale
    defaults to head_dim ** -0.5. Raises Refused with the reason for anything else."""
    y = out if out is not None else torch.empty(q.shape, dtype=q.dtype)
    _core.sequence_attention(q.detach(), k.detach(), v.detach(), y,
                             q.shape[-1] ** -0.5 if scale is None else scale, threads)
    return y


def sequence_attention_refusal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               out: torch.Tensor, scale: float) -> str:
    """'' when sequence_attention() takes this call, else the reason."""
    return _core.sequence_attention_refusal(q.detach(), k.detach(), v.detach(), out, scale)


def read_bandwidth_gbps(nbytes: int = 512 << 20, threads: int | None = None,
                        repeats: int = 5) -> float:
    """Best streaming read rate of this machine in GB/s over a buffer far larger than the caches."""
    return _core.measure_read_bandwidth(nbytes, threads or _core.num_threads(), repeats)

"""Attention over whole sequences, bf16: flashrt/gemm's sequence_attention against torch's
scaled_dot_product_attention (its CPU flash kernel) on the shapes of DiT steps.

Paired arms in one process: every round runs each arm once, alternating, on the same tensors
(laid out as a diffusers attention processor hands them over: [batch, tokens, heads * dim]
viewed per head), each arm allocating its output as torch's does. The times are each arm's
median round; `speedup_vs_torch_bf16` is the median of the rounds' paired ratios (robust to the
guest drifting between rounds), `ratio_of_medians` the ratio of the two medians. Beside the
times: TFLOP/s (4 * heads * q_len * kv_len * head_dim), the error of each arm against fp32
attention over the same bf16 values (||out - ref|| / ||ref||), and, where the CPU has AMX, the
tile ceiling the bf16 products could reach (the measured AMX-INT8 ceiling halved: a tdpbf16ps
does half a tdpbusd's products in the same time).

    .venv/bin/python bench/attention.py     # writes bench/results/<tier>/attention.json

A whole DiT step with its attention seated (attention_sequence) is bench/dit.py's: the w8a8 seats
on the bf16 twin with and without it, paired by round. (`attention.json`'s `dit_step` key holds
stop 65's measurement of the lever before the seat existed, made by a wrapper of that benchmark.)
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from flashrt_structures import ops

from _common import machine, result_path, write_result

# (what, q_len, kv_len, heads, head_dim)
SHAPES = [
    ("PixArt-Sigma self-attention (1024 tokens)", 1024, 1024, 16, 72),
    ("PixArt-Sigma cross-attention (300 caption tokens)", 1024, 300, 16, 72),
    ("SD3-shaped joint attention (1024 + 154 tokens)", 1178, 1178, 24, 64),
    ("Flux-shaped joint attention (1024 + 256 tokens)", 1280, 1280, 24, 128),
    ("Flux-shaped joint attention (4096 + 256 tokens)", 4352, 4352, 24, 128),
]


def heads(tokens: int, h: int, d: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(1, tokens, h * d, generator=g).bfloat16().view(1, tokens, h, d).transpose(
        1, 2)


def bench_shape(what: str, nq: int, nk: int, h: int, d: int, rounds: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    q, k, v = heads(nq, h, d, g), heads(nk, h, d, g), heads(nk, h, d, g)
    scale = d ** -0.5
    arms = {
        "flashrt": lambda: ops.sequence_attention(q, k, v, scale),
        "torch_sdpa_bf16": lambda: F.scaled_dot_product_attention(q, k, v),
    }
    with torch.no_grad():
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        results = {a: fn() for a, fn in arms.items()}  # warm-up, and the outputs judged
        times: dict[str, list[float]] = {a: [] for a in arms}
        for _ in range(rounds):
            for a, fn in arms.items():
                t0 = time.perf_counter()
                fn()
                times[a].append(time.perf_counter() - t0)
    flop = 4.0 * h * nq * nk * d
    row: dict[str, Any] = {"what": what, "q_len": nq, "kv_len": nk, "heads": h, "head_dim": d,
                           "rounds": rounds, "arms": {}}
    for a in arms:
        ms = statistics.median(times[a]) * 1e3
        err = ((results[a].float() - ref).norm() / ref.norm()).item()
        row["arms"][a] = {"ms": ms, "tflops": flop / ms / 1e9, "rel_error_vs_fp32": err,
                          "times_ms": [t * 1e3 for t in times[a]]}
    row["speedup_vs_torch_bf16"] = statistics.median(
        t / f for t, f in zip(times["torch_sdpa_bf16"], times["flashrt"]))
    row["ratio_of_medians"] = row["arms"]["torch_sdpa_bf16"]["ms"] / row["arms"]["flashrt"]["ms"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(2)
    from kernels import tile_int8_ceiling  # the AMX probe bench/kernels.py measures
    ceiling = tile_int8_ceiling(2)
    rows = [bench_shape(*s, rounds=a.rounds if s[1] < 4000 else max(3, a.rounds // 2))
            for s in SHAPES]
    result = {"bench": "sequence_attention", "machine": machine(),
              "int8_tile_ceiling_2_threads": ceiling,
              "bf16_tile_ceiling_tflops_derived": None if ceiling is None
              else ceiling["int8_tops"] / 2, "shapes": rows}
    print(f"\n{'shape':52} {'flashrt ms':>10} {'TF/s':>5} {'torch ms':>9} {'TF/s':>5} "
          f"{'x torch':>7} {'x medians':>9} {'err fr':>8} {'err torch':>9}")
    for r in rows:
        f, t = r["arms"]["flashrt"], r["arms"]["torch_sdpa_bf16"]
        print(f"{r['what']:52} {f['ms']:10.2f} {f['tflops']:5.2f} {t['ms']:9.2f} "
              f"{t['tflops']:5.2f} {r['speedup_vs_torch_bf16']:7.2f} {r['ratio_of_medians']:9.2f} "
              f"{f['rel_error_vs_fp32']:8.1e} {t['rel_error_vs_fp32']:9.1e}")
    if result["bf16_tile_ceiling_tflops_derived"] is not None:
        print(f"bf16 tile ceiling (derived, 2 threads): "
              f"{result['bf16_tile_ceiling_tflops_derived']:.2f} TFLOP/s")
    write_result(result_path(a.json, "attention"), result)


if __name__ == "__main__":
    main()

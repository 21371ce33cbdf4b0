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

--dit-step adds what the op would give a whole DiT step before any seat places it: bench/dit.py's
PixArt-Sigma (4 blocks) and Flux-shaped (1 double + 2 single blocks) hosts cast to bf16 with
w8a8_dynamic's seats attached, each step run with torch's scaled_dot_product_attention as it is and
with its unmasked bf16 calls sent to the op by a wrapper this benchmark installs for those steps
only (a measurement of the lever, not a door: no flashrt seat routes attention in a DiT yet).
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


def dit_step(rounds: int) -> list[dict[str, Any]]:
    """The seated bf16 DiT steps with the host's attention and with the op's (module doc)."""
    import dit
    import flashrt_structures as S

    host_sdpa = F.scaled_dot_product_attention
    sent = {"op": 0, "host": 0}

    def to_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
              is_causal: bool = False, scale: float | None = None,
              enable_gqa: bool = False) -> torch.Tensor:
        if (attn_mask is None and dropout_p == 0.0 and not is_causal and not enable_gqa
                and query.dim() == 4
                and all(t.dtype == torch.bfloat16 for t in (query, key, value))):
            sent["op"] += 1
            b, h, n, d = query.shape
            out = torch.empty(b, n, h, d, dtype=torch.bfloat16).transpose(1, 2)
            return ops.sequence_attention(query, key, value, scale, out=out)
        sent["host"] += 1
        return host_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                         is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    rows = []
    for name, (model, step_for) in (("pixart4", dit.pixart(4)), ("flux", dit.flux(1, 2))):
        with torch.no_grad():
            want = step_for(model)()
        twin = dit.bf16_twin(model)
        plan = S.auto_swaps(twin, step_for(twin), scheme="w8a8_dynamic")
        handle = plan.attach(twin)
        step = step_for(twin)
        arms = {"host_attention": host_sdpa, "op_attention": to_op}
        times: dict[str, list[float]] = {a: [] for a in arms}
        outs: dict[str, torch.Tensor] = {}
        try:
            with torch.no_grad():
                for r in range(rounds + 1):  # the first round warms up
                    for arm, fn in arms.items():
                        F.scaled_dot_product_attention = fn  # type: ignore[assignment]
                        t0 = time.perf_counter()
                        outs[arm] = step()
                        if r > 0:
                            times[arm].append(time.perf_counter() - t0)
        finally:
            F.scaled_dot_product_attention = host_sdpa  # type: ignore[assignment]
            handle.detach()
        row: dict[str, Any] = {"host": name, "seats": len(plan.swaps), "rounds": rounds,
                               "calls_sent": dict(sent), "arms": {}}
        for arm in arms:
            cos = F.cosine_similarity(outs[arm].flatten().double(), want.flatten().double(),
                                      dim=0).item()
            row["arms"][arm] = {"step_s": statistics.median(times[arm]),
                                "times_s": times[arm], "cosine_vs_fp32_host": cos}
        row["step_speedup"] = statistics.median(
            h / o for h, o in zip(times["host_attention"], times["op_attention"]))
        row["ratio_of_medians"] = (row["arms"]["host_attention"]["step_s"]
                                   / row["arms"]["op_attention"]["step_s"])
        rows.append(row)
        sent.update(op=0, host=0)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--dit-step", action="store_true", help="the seated DiT steps too (doc)")
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
    if a.dit_step:
        result["dit_step"] = dit_step(max(3, a.rounds // 2))
        print(f"\n{'DiT step (bf16 twin, w8a8 seats)':34} {'host attn s':>11} {'op attn s':>10} "
              f"{'x':>6} {'cos host':>9} {'cos op':>9}")
        for r in result["dit_step"]:
            h, o = r["arms"]["host_attention"], r["arms"]["op_attention"]
            print(f"{r['host']:34} {h['step_s']:11.4f} {o['step_s']:10.4f} "
                  f"{r['step_speedup']:6.3f} {h['cosine_vs_fp32_host']:9.6f} "
                  f"{o['cosine_vs_fp32_host']:9.6f}")
    if result["bf16_tile_ceiling_tflops_derived"] is not None:
        print(f"bf16 tile ceiling (derived, 2 threads): "
              f"{result['bf16_tile_ceiling_tflops_derived']:.2f} TFLOP/s")
    write_result(result_path(a.json, "attention"), result)


if __name__ == "__main__":
    main()

"""Decode-row kernel benchmark: flashrt int8/int4 linear vs torch F.linear (fp32, bf16).

Paired in one process: for every shape and row count the arms run alternately, round after
round, and the figure is the median of the rounds. Weights are cycled through copies, as in a
decode step where every layer's weights stream from DRAM: 96 MiB of them for the shapes' arms
(three times a 32 MiB L3; where a machine reports more, those arms read partly from cache), and
twice the largest cache the machine reports for the floor (Note [Floor from DRAM]); gbps counts
the bytes each arm must read (weights, plus scales and zeros for the packed forms).
The goal figures ("floor": M=1 on 4096x12288 and 1024x151936, 2 threads and 1) hold each run
against the read bandwidth probed just before and just after it (Note [Bracketed bandwidth] in
_common.py).

    .venv/bin/python bench/kernels.py            # writes bench/results/<tier>/kernels.json
    .venv/bin/python bench/kernels.py --floor-only   # only the bracketed goal figures
    .venv/bin/python bench/kernels.py --gemm-only    # the w8a8 GEMM at many rows (key "gemm")
    FRT_CPU_CAP=avx2 .venv/bin/python bench/kernels.py   # the AVX2 tier on an AVX-512 machine
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from flashrt_structures import _core, impls, ops

from _common import (
    bracket,
    last_level_cache_bytes,
    machine,
    result_path,
    summarize,
    timed,
    write_result,
)

SHAPES = [(1024, 2048), (1024, 6144), (3072, 1024), (4096, 12288), (1024, 151936)]  # K x N
ROWS = [1, 2, 4, 8, 16]
CACHE_BYTES = 3 * 32 * 2**20  # three times the 32 MiB L3 of the machine these shapes were set on
# The floor's copies: past the largest cache the machine reports, so a floor figure is DRAM's.
# An Intel Xeon guest here reports 480 MiB of L3, and its figures over 96 MiB of copies read
# 100-114% of the probe (Note [Floor from DRAM] in bench_floor).
LAST_LEVEL_CACHE_BYTES = last_level_cache_bytes()
FLOOR_BYTES = max(CACHE_BYTES, 2 * LAST_LEVEL_CACHE_BYTES)
INT4_GROUP = 32


def q5_1_parts(w: torch.Tensor, symmetric: bool) -> object:
    """`w` as GGUF Q5_1 (a min-max grid of 32 levels per 32 inputs, f16 d and m) or Q5_0 (a
    symmetric one, W = (u - 16) * d) would hold it, adopted as int5_gemm: the int5 forms have no
    host packer (they carry a checkpoint's own values), so the bench writes the parts itself."""
    n, k = w.shape
    g = w.detach().float().reshape(n, k // 32, 32)
    if symmetric:
        d = (g.abs().amax(-1) / 16).clamp_min(1e-8).half()
        u = (g / d.float()[..., None]).round().add(16).clamp(0, 31)
        m = None
    else:
        lo, hi = g.amin(-1), g.amax(-1)
        d = ((hi - lo) / 31).clamp_min(1e-8).half()
        m = lo.half()
        u = ((g - m.float()[..., None]) / d.float()[..., None]).round().clamp(0, 31)
    return _core.from_quantized(_core.WeightFormat.int5_gemm, 32,
                                u.to(torch.int8).reshape(n, k).numpy(), d.numpy(),
                                None if m is None else m.numpy())


# The packed forms measured: int8 per channel and with f16 group scales per 64 (the default w8
# scheme's form) and per 32 (the Q8_0 layout), int4 g32 symmetric (f32 scales) and asymmetric
# with f16 scales and mins (Q4_1, the default w4 scheme's form).
PACKERS: dict[str, Callable[[torch.Tensor], object]] = {
    "int8": lambda w: ops.pack_int8(w),
    "int8_g64_f16": lambda w: ops.pack_int8(w, 64, "f16"),  # w8a16_decode's form
    "int8_g32_f16": lambda w: ops.pack_int8(w, 32, "f16"),
    "int4": lambda w: ops.pack_int4(w, INT4_GROUP, True),
    "int4_g32_asym_f16": lambda w: ops.pack_int4(w, 32, False, "f16"),
    "int4_super": lambda w: ops.pack_int4_super(w),  # GGUF Q4_K's form, 4.625 bits a weight
    "int8_super": lambda w: ops.pack_int8_super(w),  # GGUF Q6_K's form, 8.5625 bits a weight
    "int8_g16": lambda w: ops.pack_int8(w, 16),  # its re-expression before (f32 scales, 10 bits)
    # The integer GEMM's forms (flashrt/gemm): activations quantized to int8 inside the call
    # (integer dot products, no int8->fp32 convert per weight). w8a8_rows: one scale per row
    # (the DiT form); w8a8: per block of 32 (w8a8_decode's form); w4a8(_asym): int4 g32 nibbles
    # against the same blocks (w4a8_decode, w4a8_asym_decode).
    "w8a8_rows": lambda w: ops.pack_int8_gemm(w),
    "w8a8": lambda w: ops.pack_int8_gemm(w, 32),
    "w4a8": lambda w: ops.pack_int4_gemm(w, True),
    "w4a8_asym": lambda w: ops.pack_int4_gemm(w, False),
    # GGUF Q4_K's values against the same blocks (int4_super_gemm, 4.625 bits a weight).
    "w4a8_super": lambda w: ops.pack_int4_super_gemm(w),
    # GGUF Q6_K's values in six bits against the same blocks (int6_super_gemm, 6.5625 bits).
    "w6a8_super": lambda w: ops.pack_int6_super_gemm(w),
    # GGUF Q5_0's and Q5_1's forms against the same blocks (int5_gemm: 5.5 and 6 bits).
    "w5a8_sym": lambda w: q5_1_parts(w, True),
    "w5a8": lambda w: q5_1_parts(w, False),
}


def copies_for(nbytes: int, total: int = CACHE_BYTES) -> int:
    """How many copies of nbytes reach `total` bytes between them."""
    return max(1, -(-total // nbytes))


def time_arm(calls: list[Callable[[], object]], iters: int) -> float:
    """Seconds per call, cycling through the weight copies."""
    t0 = time.perf_counter()
    for i in range(iters):
        calls[i % len(calls)]()
    return (time.perf_counter() - t0) / iters


def bench_shape(k: int, n: int, rounds: int, budget_s: float) -> list[dict]:
    gen = torch.Generator().manual_seed(k * 7 + n)
    w32 = torch.randn(n, k, generator=gen) * 0.05
    fmt_weights: dict[str, list] = {}
    nbytes: dict[str, int] = {}

    nbytes["torch_fp32"] = n * k * 4
    fmt_weights["torch_fp32"] = [w32] + [w32.clone() for _ in range(copies_for(n * k * 4) - 1)]
    wbf = w32.to(torch.bfloat16)
    nbytes["torch_bf16"] = n * k * 2
    fmt_weights["torch_bf16"] = [wbf] + [wbf.clone() for _ in range(copies_for(n * k * 2) - 1)]
    for name, pack in PACKERS.items():
        first = pack(w32)
        nbytes[name] = first.nbytes
        fmt_weights[name] = [first] + [pack(w32) for _ in range(copies_for(first.nbytes) - 1)]
    del w32, wbf

    rows = []
    for m in ROWS:
        x32 = torch.randn(m, k, generator=gen)
        xbf = x32.to(torch.bfloat16)
        y8 = torch.empty(m, n)
        arms: dict[str, list[Callable[[], object]]] = {
            "torch_fp32": [lambda w=w: F.linear(x32, w) for w in fmt_weights["torch_fp32"]],
            "torch_bf16": [lambda w=w: F.linear(xbf, w) for w in fmt_weights["torch_bf16"]],
            **{name: [lambda w=w: ops.linear(x32, w, out=y8) for w in fmt_weights[name]]
               for name in PACKERS},
        }
        # Calibrate iterations so one round of one arm takes about budget_s / rounds / 4.
        iters = {}
        for name, calls in arms.items():
            t = time_arm(calls, max(1, len(calls)))  # warm-up, one pass over the copies
            iters[name] = max(len(calls), int(budget_s / rounds / len(arms) / max(t, 1e-6)))
        samples: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(rounds):
            for name, calls in arms.items():
                samples[name].append(time_arm(calls, iters[name]))
        base = statistics.median(samples["torch_fp32"])
        for name, ts in samples.items():
            secs = statistics.median(ts)
            rows.append(
                {
                    "format": name,
                    "M": m,
                    "K": k,
                    "N": n,
                    "seconds": secs,
                    "bytes": nbytes[name],
                    "gbps": nbytes[name] / secs / 1e9,
                    "speedup_vs_torch_fp32": base / secs,
                    "copies": len(arms[name]),
                    "iters_per_round": iters[name],
                }
            )
    return rows


FLOOR_SHAPES = [(4096, 12288), (1024, 151936)]  # K x N: the goal shapes


def bench_floor(rounds: int, forms: list[str] | None = None) -> list[dict]:
    """Every packed form at M = 1 on the goal shapes, on 2 threads and on 1, each run held
    against the read bandwidth taken just before and just after it (Note [Bracketed bandwidth]
    in _common.py), forms and thread counts alternated round by round.

    Each round packs its weights afresh: on this guest one buffer can read ~30% slower than
    another for a whole run (the per-channel int8 head read 17.5 GB/s on one thread in all nine
    rounds of one run, fresh packs of it 25-26), so a form packed once would carry its buffer's
    placement into every bracket; packed per round, a bad placement costs one.

    Note [Floor from DRAM]: the calls cycle through copies of the pack totalling FLOOR_BYTES,
    twice the largest cache the machine reports, so each call reads its weights from DRAM, as a
    decode step does, and the figure is held against a probe that reads DRAM too (256 MiB is past
    a 32 MiB L3; the 480 MiB one reads ~30 GB/s at 2 threads from 256 MiB to 2 GiB). The copies
    are PackedLinear.copy(), a memcpy each: packing a GiB of int4 afresh took minutes a round."""
    out = []
    for k, n in FLOOR_SHAPES:
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(k + n)) * 0.05
        x, y = torch.randn(1, k), torch.empty(1, n)
        packers = {f: PACKERS[f] for f in (forms or PACKERS)}
        got: dict[tuple[str, int], list] = {(f, t): [] for f in packers for t in (2, 1)}
        nbytes: dict[str, int] = {}
        for _ in range(rounds):
            for name, pack in packers.items():
                first = pack(w)
                count = copies_for(first.nbytes, FLOOR_BYTES)
                copies = [first] + [first.copy() for _ in range(count - 1)]
                nbytes[name] = first.nbytes
                for t in (2, 1):
                    state = {"i": 0}

                    def call(copies=copies, t=t, state=state):
                        ops.linear(x, copies[state["i"] % len(copies)], out=y, threads=t)
                        state["i"] += 1
                    got[(name, t)].append(bracket(timed(call), first.nbytes, threads=t))
                del first, copies
        del w
        for (name, t), brackets in got.items():
            out.append({"format": name, "M": 1, "K": k, "N": n, "threads": t,
                        "bytes": nbytes[name], **summarize(brackets)})
    return out


def print_floor(rows: list[dict]) -> None:
    print("M=1 against the bracketing read bandwidth (median of steady brackets, quartiles):")
    print(f"{'format':<18}{'K x N':>12}{'2 threads GB/s':>16}{'of bw':>7}{'quartiles':>13}"
          f"{'1 thread GB/s':>15}{'of bw':>7}")
    by = {(r["format"], r["K"], r["N"], r["threads"]): r for r in rows}
    for (name, k, n, t), r in by.items():
        if t != 2:
            continue
        one = by[(name, k, n, 1)]
        q = r["frac_quartiles"]
        print(f"{name:<18}{f'{k}x{n}':>12}{r['gbps']:>9.1f} of {r['bandwidth_gbps']:>4.1f}"
              f"{r['frac_of_bandwidth']:>7.0%}{f'{q[0]:.0%}-{q[1]:.0%}':>13}"
              f"{one['gbps']:>8.1f} of {one['bandwidth_gbps']:>4.1f}"
              f"{one['frac_of_bandwidth']:>7.0%}")


def bench_threading(bandwidth: float) -> list[dict]:
    """Every packed form on 4096x12288 at M = 1 and 16, on one and on two kernel threads (arms
    alternated), with the read bandwidth one thread reaches beside them; then int8 M=1 next to
    torch work (the pool's workers spin briefly, then sleep, so they should not slow torch's
    threads or be slowed)."""
    k, n = 4096, 12288
    w = torch.randn(n, k) * 0.05
    bw1 = ops.read_bandwidth_gbps(1 << 30, threads=1, repeats=3)
    out = []
    for name, pack in PACKERS.items():
        first = pack(w)
        packed = [first] + [pack(w) for _ in range(copies_for(first.nbytes) - 1)]
        for m in (1, 16):
            x, y = torch.randn(m, k), torch.empty(m, n)
            med = {}
            samples: dict[int, list[float]] = {1: [], 2: []}
            for _ in range(5):
                for t in (1, 2):
                    t0 = time.perf_counter()
                    for i in range(8):
                        ops.linear(x, packed[i % len(packed)], out=y, threads=t)
                    samples[t].append((time.perf_counter() - t0) / 8)
            med = {t: statistics.median(v) for t, v in samples.items()}
            out.append({"case": "threads", "format": name, "M": m, "K": k, "N": n,
                        "seconds_1_thread": med[1], "seconds_2_threads": med[2],
                        "gbps_1_thread": first.nbytes / med[1] / 1e9,
                        "gbps_2_threads": first.nbytes / med[2] / 1e9,
                        "frac_of_1_thread_bandwidth": first.nbytes / med[1] / 1e9 / bw1,
                        "frac_of_bandwidth_2_threads": first.nbytes / med[2] / 1e9 / bandwidth})
        del packed, first
    packed = [ops.pack_int8(w) for _ in range(copies_for(n * k))]
    x = torch.randn(1, k)
    y = torch.empty(1, n)
    small = torch.randn(4096, 1024)  # a torch op between kernels, as in a decode step
    xs = torch.randn(1, 4096)
    cases = {
        "kernel_2_threads": lambda i: ops.linear(x, packed[i % len(packed)], out=y, threads=2),
        "torch_op_alone": lambda i: F.linear(xs, small.T),
        "kernel_then_torch_op": lambda i: (
            ops.linear(x, packed[i % len(packed)], out=y),
            F.linear(xs, small.T),
        ),
    }
    samples2: dict[str, list[float]] = {c: [] for c in cases}
    for _ in range(7):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            for i in range(30):
                fn(i)
            samples2[name].append((time.perf_counter() - t0) / 30)
    med2 = {c: statistics.median(v) for c, v in samples2.items()}
    out.append(
        {
            "case": "summary",
            "interleave_overhead_seconds": med2["kernel_then_torch_op"]
            - med2["kernel_2_threads"]
            - med2["torch_op_alone"],
            "read_bandwidth_gbps": bandwidth,
            "read_bandwidth_gbps_1_thread": bw1,
            "torch_threads": torch.get_num_threads(),
        }
    )
    return out


def bench_in_cache() -> list[dict]:
    """Each packed form at M=1 on a weight that stays in L2 (4096x256, called over and over): the
    rate the kernel computes at when memory does not bound it. Where this ceiling is below the
    DRAM read bandwidth, the form is bound by its instructions, not by bytes."""
    k, n = 4096, 256
    w = torch.randn(n, k) * 0.05
    x, y = torch.randn(1, k), torch.empty(1, n)
    out = []
    for name, pack in PACKERS.items():
        packed = pack(w)
        for _ in range(50):
            ops.linear(x, packed, out=y)  # warm the caches
        samples: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(7):
            for t in (1, 2):
                t0 = time.perf_counter()
                for _ in range(200):
                    ops.linear(x, packed, out=y, threads=t)
                samples[t].append((time.perf_counter() - t0) / 200)
        med = {t: statistics.median(v) for t, v in samples.items()}
        out.append({"case": "in_cache", "format": name, "M": 1, "K": k, "N": n,
                    "bytes": packed.nbytes,
                    "gbps_1_thread": packed.nbytes / med[1] / 1e9,
                    "gbps_2_threads": packed.nbytes / med[2] / 1e9})
    return out


def bench_huge_pages(working_set: int, k: int = 4096, n: int = 12288,
                     form: str = "int8") -> dict:
    """`form` M=1 on k x n, cycling through copies that fill `working_set` bytes, its weights
    packed in the huge-page arena (the default) and in the C library's blocks (FRT_HUGE_PAGES=0,
    read at each allocation: 4 KiB pages under THP "madvise"), arms alternated round by round;
    and the read probe on each kind of memory (Note [Weights in huge pages])."""
    w = torch.randn(n, k) * 0.05
    packed: dict[str, list] = {}
    probe: dict[str, list[float]] = {"huge": [], "small": []}
    previous = os.environ.get("FRT_HUGE_PAGES")
    try:
        for kind, flag in (("huge", "1"), ("small", "0")):
            os.environ["FRT_HUGE_PAGES"] = flag
            first = PACKERS[form](w)
            packed[kind] = [first] + [first.copy()
                                      for _ in range(copies_for(first.nbytes, working_set) - 1)]
        x, y = torch.randn(1, k), torch.empty(1, n)
        samples: dict[str, list[float]] = {"huge": [], "small": []}
        for _ in range(9):
            for kind in ("huge", "small"):
                calls = 2 * len(packed[kind])
                t0 = time.perf_counter()
                for i in range(calls):
                    ops.linear(x, packed[kind][i % len(packed[kind])], out=y)
                samples[kind].append((time.perf_counter() - t0) / calls)
        for _ in range(3):
            for kind, flag in (("huge", "1"), ("small", "0")):
                os.environ["FRT_HUGE_PAGES"] = flag
                probe[kind].append(ops.read_bandwidth_gbps(1 << 30, repeats=2))
    finally:
        if previous is None:
            os.environ.pop("FRT_HUGE_PAGES", None)
        else:
            os.environ["FRT_HUGE_PAGES"] = previous
    nbytes = packed["huge"][0].nbytes
    med = {kind: statistics.median(v) for kind, v in samples.items()}
    return {"format": form, "M": 1, "K": k, "N": n, "bytes": nbytes,
            "working_set_bytes": nbytes * len(packed["huge"]),
            "seconds_huge_pages": med["huge"], "seconds_small_pages": med["small"],
            "gbps_huge_pages": nbytes / med["huge"] / 1e9,
            "gbps_small_pages": nbytes / med["small"] / 1e9,
            "speedup_huge_over_small": med["small"] / med["huge"],
            "probe_gbps_huge_pages": probe["huge"], "probe_gbps_small_pages": probe["small"]}


def huge_page_pairs() -> list[dict]:
    # A wide projection (50 MB a call) over the floor's copies (past every cache) and over a
    # Qwen3-0.6B int8 decode step's weights; then that model's own projections (1024 x 3072 up,
    # 3072 x 1024 down: 1.6-3.1 MB a call, the size a decode step calls) in its decode forms.
    step = 600 * 2**20
    return [bench_huge_pages(FLOOR_BYTES), bench_huge_pages(step),
            *(bench_huge_pages(step, k, n, form)
              for k, n in ((1024, 3072), (3072, 1024))
              for form in ("int8_g64_f16", "int4_super", "w4a8_super"))]


def print_huge_pages(pairs: list[dict]) -> None:
    for h in pairs:
        print(f"{h['format']} M=1 {h['K']}x{h['N']} over {h['working_set_bytes'] / 2**20:.0f} MiB "
              f"of copies: huge pages {h['gbps_huge_pages']:.1f} GB/s, 4 KiB pages "
              f"{h['gbps_small_pages']:.1f} ({h['speedup_huge_over_small']:.2f}x); read probe "
              f"{max(h['probe_gbps_huge_pages']):.1f} vs "
              f"{max(h['probe_gbps_small_pages']):.1f} GB/s")


# The GEMM at many rows (prefill chunks, DiT tokens): K x N of the DiT (PixArt-Sigma 1152 wide,
# Flux 3072) and Qwen3-0.6B (hidden 1024, 16 x 128 query heads, intermediate 3072) projections.
GEMM_SHAPES = [(1152, 1152), (1152, 4608), (4608, 1152), (3072, 3072), (3072, 12288),
               (1024, 2048), (1024, 3072), (3072, 1024)]
GEMM_ROWS = [128, 512, 2048]


def tile_int8_ceiling(threads: int) -> dict | None:
    """The measured AMX-INT8 ceiling (bench/probes/amx_int8_ceiling.cpp: tdpbusd on operands
    already in tiles), or None where this CPU has no AMX or no compiler is at hand."""
    if "amx_int8" not in _core.cpu().features or shutil.which("g++") is None:
        return None
    src = Path(__file__).resolve().parent / "probes" / "amx_int8_ceiling.cpp"
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "probe"
        subprocess.run(["g++", "-O2", "-mamx-tile", "-mamx-int8", "-pthread", str(src), "-o",
                        str(exe)], check=True)
        out = subprocess.run([str(exe), str(threads)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def bench_gemm(rounds: int, shapes: list[tuple[int, int]]) -> dict:
    """The w8a8 GEMM (int8_gemm per channel, activations per row at run time; the variant the hub
    chose) against torch's F.linear in fp32 and in bf16 (oneDNN; AMX where the CPU has it), bf16
    in and out for flashrt and the bf16 arm, paired: the arms alternate within every round and the
    figure is the median round. Beside them the block forms the decode schemes' prefill runs
    (activations per block of 32: int8_gemm g32, w8a8_decode's; int4_gemm, w4a8_decode's).
    TOP/s counts 2 * M * K * N."""
    ceiling = {t: tile_int8_ceiling(t) for t in (1, 2)}
    bandwidth = ops.read_bandwidth_gbps(1 << 30, repeats=3)  # beside the compute ceiling
    rows = []
    print(f"{'M':>5}{'K':>6}{'N':>7}{'fp32 ms':>9}{'bf16 ms':>9}{'flashrt ms':>11}{'TOP/s':>7}"
          f"{'vs bf16':>8}{'vs fp32':>8}{'g32 TOP/s':>10}{'w4a8 TOP/s':>11}")
    for k, n in shapes:
        w = torch.randn(n, k) * 0.02
        bias = torch.randn(n) * 0.1
        packed = ops.pack_int8_gemm(w)
        blocks = ops.pack_int8_gemm(w, 32)
        nibbles = ops.pack_int4_gemm(w, True)
        wb, bb = w.bfloat16(), bias.bfloat16()
        for m in GEMM_ROWS:
            x = torch.randn(m, k)
            xb = x.bfloat16()
            y = torch.empty(m, n, dtype=torch.bfloat16)
            arms: dict[str, Callable[[], object]] = {
                "torch_fp32": lambda x=x, w=w, bias=bias: F.linear(x, w, bias),
                "torch_bf16": lambda xb=xb, wb=wb, bb=bb: F.linear(xb, wb, bb),
                "flashrt_w8a8": lambda xb=xb, y=y: ops.linear(xb, packed, bias, out=y),
                "flashrt_w8a8_blocks": lambda xb=xb, y=y: ops.linear(xb, blocks, bias, out=y),
                "flashrt_w4a8": lambda xb=xb, y=y: ops.linear(xb, nibbles, bias, out=y),
            }
            for fn in arms.values():  # warm: first-touch pages, oneDNN's primitive cache
                fn()
            reps = max(1, int(0.2 / max(1e-4, time_arm([arms["torch_fp32"]], 1))))
            times: dict[str, list[float]] = {a: [] for a in arms}
            for _ in range(rounds):
                for a, fn in arms.items():
                    times[a].append(time_arm([fn], reps))
            med = {a: statistics.median(t) for a, t in times.items()}
            ops_ = 2.0 * m * k * n
            want = F.linear(x.double(), w.double(), bias.double())
            got = ops.linear(xb, packed, bias, out=y).double()
            cos = float(F.cosine_similarity(got.flatten(), want.flatten(), dim=0))
            bf = arms["torch_bf16"]().double()
            cos_bf16 = float(F.cosine_similarity(bf.flatten(), want.flatten(), dim=0))
            row = {"M": m, "K": k, "N": n, "seconds": med,
                   "tops": {a: ops_ / t / 1e12 for a, t in med.items()},
                   "flashrt_vs_torch_bf16": med["torch_bf16"] / med["flashrt_w8a8"],
                   "flashrt_vs_torch_fp32": med["torch_fp32"] / med["flashrt_w8a8"],
                   "round_ratios_vs_bf16": [b / f for b, f in zip(times["torch_bf16"],
                                                                  times["flashrt_w8a8"])],
                   "cosine_vs_fp64": {"flashrt_w8a8": cos, "torch_bf16": cos_bf16}}
            if ceiling[2]:
                row["frac_of_int8_tile_ceiling"] = row["tops"]["flashrt_w8a8"] / max(
                    ceiling[1]["int8_tops"], ceiling[2]["int8_tops"])
            rows.append(row)
            print(f"{m:>5}{k:>6}{n:>7}{med['torch_fp32'] * 1e3:>9.2f}"
                  f"{med['torch_bf16'] * 1e3:>9.2f}{med['flashrt_w8a8'] * 1e3:>11.2f}"
                  f"{row['tops']['flashrt_w8a8']:>7.2f}{row['flashrt_vs_torch_bf16']:>7.2f}x"
                  f"{row['flashrt_vs_torch_fp32']:>7.2f}x"
                  f"{row['tops']['flashrt_w8a8_blocks']:>10.2f}{row['tops']['flashrt_w4a8']:>11.2f}",
                  flush=True)
    return {"int8_tile_ceiling": ceiling, "read_bandwidth_gbps": bandwidth, "rounds": rounds,
            "rows": rows,
            "variant": next(p["chosen"] for p in impls.kernels_report()["packages"]
                            if p["repo"] == "flashrt/gemm")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write the results "
                             "(default bench/results/<tier>/kernels.json)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=2.0, help="seconds per (shape, M)")
    parser.add_argument("--shapes", default="all", help="'all' or e.g. 1024x2048,4096x12288")
    parser.add_argument("--huge-pages-only", action="store_true",
                        help="only the huge-page pairing "
                             "(default bench/results/<tier>/huge_pages.json)")
    parser.add_argument("--floor-only", action="store_true",
                        help="only the bracketed M=1 goal shapes (key 'floor' of kernels.json)")
    parser.add_argument("--floor-rounds", type=int, default=9)
    parser.add_argument("--gemm-only", action="store_true",
                        help="only the w8a8 GEMM at 128, 512 and 2048 rows (key 'gemm')")
    parser.add_argument("--floor-forms", default=None,
                        help="with --floor-only: a comma list of forms (default every one)")
    args = parser.parse_args()
    if args.huge_pages_only:
        pairs = huge_page_pairs()
        print_huge_pages(pairs)
        write_result(result_path(args.json, "huge_pages"), {"machine": machine(), "pairs": pairs})
        return 0

    if args.gemm_only:
        path = result_path(args.json, "kernels")
        result = json.loads(path.read_text()) if path.exists() else {}
        result["machine"] = machine()
        shapes = GEMM_SHAPES if args.shapes == "all" else [
            tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        result["gemm"] = bench_gemm(args.rounds, shapes)
        c = result["gemm"]["int8_tile_ceiling"]
        print(f"read bandwidth {result['gemm']['read_bandwidth_gbps']:.1f} GB/s; "
              f"variant {result['gemm']['variant']}; AMX-INT8 ceiling: "
              + (f"{c[1]['int8_tops']:.2f} TOP/s on 1 thread, {c[2]['int8_tops']:.2f} on 2"
                 if c[2] else "none (no AMX)"))
        write_result(path, result)
        return 0

    if args.floor_only:
        path = result_path(args.json, "kernels")
        result = json.loads(path.read_text()) if path.exists() else {}
        result["machine"] = machine()
        if "floor" in result:  # the run this one repeats stays beside it, not overwritten
            result["floor_previous_run"] = result["floor"]
        forms = args.floor_forms.split(",") if args.floor_forms else None
        if forms and (bad := sorted(set(forms) - set(PACKERS))):
            parser.error(f"unknown forms {bad}; known: {sorted(PACKERS)}")
        result["floor"] = bench_floor(args.floor_rounds, forms)
        result["floor_copies_bytes"] = FLOOR_BYTES
        result["last_level_cache_bytes"] = LAST_LEVEL_CACHE_BYTES
        print_floor(result["floor"])
        write_result(path, result)
        return 0

    shapes = SHAPES
    if args.shapes != "all":
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    bandwidth = ops.read_bandwidth_gbps(1 << 30, repeats=5)
    report = impls.kernels_report()
    result = {
        # The shared machine record, plus what the kernel path chose here.
        "machine": {**machine(), "kernel_threads": report["threads"],
                    "variants": {p["repo"]: p["chosen"] for p in report["packages"]}},
        "read_bandwidth_gbps": bandwidth,
        "int4_group": INT4_GROUP,
        "rows": [],
    }
    print(f"machine: {result['machine']['cpu']}, {result['machine']['cores']} cores, "
          f"tier {result['machine']['tier']}, torch {torch.__version__}")
    print(f"read bandwidth: {bandwidth:.1f} GB/s")
    print(f"{'format':<18}{'M':>3}{'K':>6}{'N':>8}{'us':>10}{'GB/s':>8}{'of bw':>7}{'vs fp32':>9}")
    samples = [bandwidth]
    for k, n in shapes:
        # The VM's bandwidth drifts by tens of percent: sample it again before every shape and
        # judge every row against the best sample of the run (printed rows use the running best).
        samples.append(ops.read_bandwidth_gbps(1 << 30, repeats=2))
        bandwidth = max(samples)
        for row in bench_shape(k, n, args.rounds, args.budget):
            row["frac_of_bandwidth"] = row["gbps"] / bandwidth
            # Against the sample taken just before this shape, too: the drift is slow enough
            # that the adjacent sample is what the shape's rounds could read.
            row["adjacent_bandwidth_gbps"] = samples[-1]
            row["frac_of_adjacent_bandwidth"] = row["gbps"] / samples[-1]
            result["rows"].append(row)
            print(f"{row['format']:<18}{row['M']:>3}{row['K']:>6}{row['N']:>8}"
                  f"{row['seconds'] * 1e6:>10.1f}{row['gbps']:>8.1f}"
                  f"{row['frac_of_bandwidth']:>7.0%}{row['speedup_vs_torch_fp32']:>8.2f}x")
    bandwidth = max(samples)
    result["read_bandwidth_gbps"] = bandwidth
    result["read_bandwidth_samples"] = samples
    for row in result["rows"]:
        row["frac_of_bandwidth"] = row["gbps"] / bandwidth
    result["floor"] = bench_floor(args.floor_rounds)
    result["floor_copies_bytes"] = FLOOR_BYTES
    result["last_level_cache_bytes"] = LAST_LEVEL_CACHE_BYTES
    result["threading"] = bench_threading(bandwidth)
    result["in_cache"] = bench_in_cache()
    result["huge_pages"] = huge_page_pairs()
    s = result["threading"][-1]
    print(f"threads, 4096x12288 (read bandwidth {s['read_bandwidth_gbps_1_thread']:.1f} GB/s on "
          f"1 thread, {bandwidth:.1f} on 2):")
    print(f"{'format':<18}{'M':>3}{'1 thread GB/s':>15}{'2 threads GB/s':>16}")
    for r in result["threading"][:-1]:
        print(f"{r['format']:<18}{r['M']:>3}{r['gbps_1_thread']:>15.1f}{r['gbps_2_threads']:>16.1f}")
    print(f"int8 M=1 next to a torch op: {s['interleave_overhead_seconds'] * 1e6:+.1f} us per pair")
    print_huge_pages(result["huge_pages"])
    print_floor(result["floor"])
    print("in cache (4096x256, M=1): the compute ceiling beside the read bandwidth")
    print(f"{'format':<18}{'1 thread GB/s':>15}{'2 threads GB/s':>16}{'of bw':>7}")
    for r in result["in_cache"]:
        print(f"{r['format']:<18}{r['gbps_1_thread']:>15.1f}{r['gbps_2_threads']:>16.1f}"
              f"{r['gbps_2_threads'] / bandwidth:>7.0%}")
    write_result(result_path(args.json, "kernels"), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

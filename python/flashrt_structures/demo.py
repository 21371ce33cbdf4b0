"""The main job on its embedded default: what this machine's kernel path resolved, then one
decode-row projection packed in int8 and int4, checked against torch and timed against it.

The default is a 2048x1024 projection (Qwen3-0.6B-sized q_proj), seeded, at one row.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from . import impls, ops

N, K, ROWS = 2048, 1024, 1


def _median_seconds(fn, iters: int = 200) -> float:
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    report = impls.kernels_report()
    cpu = report["cpu"]
    print(f"[flashrt] CPU {cpu['arch']} tier {cpu['tier']}, {report['threads']} threads")
    for p in report["packages"]:
        print(f"[flashrt] {p['repo']}: chosen {p['chosen'] or 'NONE'} ({p['source'] or 'not found'})")
    for e in report["unavailable"]:
        print(f"[flashrt] unavailable {e['repo']}: {e['error']}: {e['detail']}")

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(N, K, generator=gen) * 0.05
    x = torch.randn(ROWS, K, generator=gen)
    host = _median_seconds(lambda: F.linear(x, w))
    print(f"\n{'form':<22}{'max |y - ref|':>14}{'pack rel err':>14}{'us':>9}{'vs torch f32':>14}")
    print(f"{'torch f32':<22}{'':>14}{'':>14}{host * 1e6:>9.1f}{1.0:>13.2f}x")
    for packed in (ops.pack_int8(w), ops.pack_int4(w, 32, True), ops.pack_int4(w, 128, False)):
        ref = F.linear(x, torch.from_numpy(packed.dequantize()))
        y = ops.linear(x, packed)
        err = (y - ref).abs().max().item()
        t = _median_seconds(lambda: ops.linear(x, packed))
        print(
            f"{packed.form:<22}{err:>14.2e}{packed.stats.rel_err:>14.4f}"
            f"{t * 1e6:>9.1f}{host / t:>13.2f}x"
        )
    print("\n(paired timings are in bench/kernels.py; this is a smoke run)")
    return 0

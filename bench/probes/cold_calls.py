"""One decode-row call (M = 1) of a projection-sized weight, cold and hot: each call on a copy of
the weight not read since ~600 MB of others were (as a decode step meets its weights: from DRAM,
once each), against the same call repeated on one copy (in L2 and L3: the kernel's own
instructions and the call's fixed costs, which the cold figure carries too). Beside both, the
floor: the pack's bytes over a read probe taken right after. Where the hot call is well under
the floor and the cold call well over it, the weights' path from DRAM is what a step loses, not
the kernel's arithmetic; where hot and floor are near, the kernel's instructions and the reads
contend. A probe for the decode floor on a machine (which forms, which shapes, how far), not a
floor figure: those are bench/kernels.py --floor-only's, held against bracketing probes.

    .venv/bin/python bench/probes/cold_calls.py --json bench/results/amx/cold_calls.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from flashrt_structures import ops

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kernels import PACKERS  # noqa: E402

from _common import machine, probe, write_result  # noqa: E402

# Qwen3-0.6B's projection widths (in x out): q/o-sized and the feed-forward's up / gate.
SHAPES = [(1024, 3072), (1024, 12288)]
FORMS = ["w4a8_super", "int4_super", "int4_g32_asym_f16", "int8_g64_f16", "w8a8"]
COLD_BYTES = 600e6  # the copies cycled through: past any cache this guest reports


def measure(form: str, k: int, n: int, threads: int, rounds: int) -> dict:
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(n, k, generator=gen) * 0.05
    first = PACKERS[form](w)
    copies = int(COLD_BYTES / first.nbytes) + 1
    packs = [first] + [first.copy() for _ in range(copies - 1)]
    x, y = torch.randn(1, k, generator=gen), torch.empty(1, n)
    for p in packs:  # every copy once: first-touch and the kernels' first calls out of the way
        ops.linear(x, p, out=y, threads=threads)
    cold, hot, bandwidth = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for p in packs[1:]:  # not `first`: the hot loop below keeps it in cache
            ops.linear(x, p, out=y, threads=threads)
        cold.append((time.perf_counter() - t0) / (copies - 1))
        t0 = time.perf_counter()
        for _ in range(200):
            ops.linear(x, first, out=y, threads=threads)
        hot.append((time.perf_counter() - t0) / 200)
        bandwidth.append(probe(threads))
    nbytes, gbps = first.nbytes, statistics.median(bandwidth)
    floor = nbytes / (gbps * 1e9)
    return {"form": form, "k": k, "n": n, "threads": threads, "bytes": nbytes, "copies": copies,
            "cold_us": statistics.median(cold) * 1e6, "hot_us": statistics.median(hot) * 1e6,
            "probe_gbps": gbps, "floor_us": floor * 1e6,
            "cold_frac_of_floor": floor / statistics.median(cold),
            "hot_frac_of_floor": floor / statistics.median(hot)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    rows = []
    print(f"{'form':18s} {'k x n':>11s} {'MB':>6s} {'cold us':>8s} {'hot us':>8s} "
          f"{'floor us':>9s} {'cold/floor':>10s}")
    for form in FORMS:
        for k, n in SHAPES:
            r = measure(form, k, n, args.threads, args.rounds)
            rows.append(r)
            print(f"{form:18s} {k:>5d}x{n:<5d} {r['bytes'] / 1e6:6.1f} {r['cold_us']:8.1f} "
                  f"{r['hot_us']:8.1f} {r['floor_us']:9.1f} {r['cold_frac_of_floor']:10.2f}",
                  flush=True)
    if args.json is not None:
        write_result(args.json, {"machine": machine(), "rounds": args.rounds,
                                 "threads": args.threads, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

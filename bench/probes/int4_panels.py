"""The weight-only int4 panels at one and four rows, where their own instructions bound them: one
small weight called again and again (it stays in L2) and four copies of a large one (past L2),
on one thread and on two, GB/s of packed bytes and G weights/s. A probe for a change to the
panels' inner loop (run it on the build before and after; the figures are of one build), not a
floor figure: those are bench/kernels.py --floor-only's, held against the bracketing bandwidth.

    .venv/bin/python bench/probes/int4_panels.py --json bench/results/amx/int4_panels.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from flashrt_structures import ops

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kernels import PACKERS  # noqa: E402  (the kernel bench's packers: the same forms)

from _common import machine, write_result  # noqa: E402

# Q4_K's form, w4a16_decode's (Q4_1's), and symmetric int4 g32: the FMA int4 panels' three.
FORMS: dict[str, Callable[[torch.Tensor], object]] = {
    "int4_super": PACKERS["int4_super"],
    "int4_g32_asym_f16": PACKERS["int4_g32_asym_f16"],
    "int4_g32_sym": PACKERS["int4"],
}
# (K, N, copies, where the weights are read from)
PLACES = [(1024, 2048, 1, "L2"), (4096, 12288, 4, "past L2")]


def rate(pack: Callable[[torch.Tensor], object], k: int, n: int, copies: int, m: int,
         threads: int, repeats: int) -> tuple[float, float]:
    """Median GB/s of packed bytes over `repeats` timed spans, and the bits a weight takes."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(n, k, generator=gen) * 0.05
    packs = [pack(w) for _ in range(copies)]
    x, y = torch.randn(m, k, generator=gen), torch.empty(m, n)
    nbytes = packs[0].nbytes
    calls = max(20, int(3e9 / (nbytes * 8)))
    for p in packs:  # warm: every copy once
        ops.linear(x, p, out=y, threads=threads)
    spans = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(calls):
            ops.linear(x, packs[i % copies], out=y, threads=threads)
        spans.append(nbytes * calls / (time.perf_counter() - t0) / 1e9)
    return statistics.median(spans), nbytes * 8 / (k * n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rows = []
    for threads in (1, 2):
        for form, pack in FORMS.items():
            for k, n, copies, where in PLACES:
                for m in (1, 4):
                    gbps, bits = rate(pack, k, n, copies, m, threads, args.repeats)
                    rows.append({"form": form, "threads": threads, "k": k, "n": n, "rows": m,
                                 "read_from": where, "gbps": gbps, "bits_per_weight": bits,
                                 "g_weights_per_s": gbps * 8 / bits})
                    print(f"{threads} thread(s) {form:18s} {where:8s} {k}x{n} M={m}: "
                          f"{gbps:6.1f} GB/s ({gbps * 8 / bits:5.1f} G weights/s)", flush=True)
    if args.json is not None:
        write_result(args.json, {"machine": machine(), "repeats": args.repeats, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

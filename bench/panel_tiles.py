"""The weight-only panels on AMX-BF16 tiles against the FMA panels, at 1..16 rows.

The two arms are two builds of the same package on one machine: the amx variant (tiles from 9
rows, per channel from 5: tile_from_amx, Note [Tile panels] in
kernels/common/src/x86/amx/panels_amx.cpp) and the avx512vnni variant
(FRT_CPU_CAP=avx512vnni). A process loads one variant, so the arms run in alternating processes,
round after round; each process times every (form, rows) on one pack (in cache) and cycling
enough packs to leave the last-level cache (from DRAM). Medians; fp32 activations, 2 threads.

    .venv/bin/python bench/panel_tiles.py     # writes bench/results/<tier>/panel_tiles.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

K, N, PACKS, CALLS = 2048, 8192, 23, 23
ROWS = (1, 2, 4, 5, 6, 8, 9, 10, 12, 16)
ARMS = {"tiles": "", "fma": "avx512vnni"}  # arm -> FRT_CPU_CAP


def child() -> None:
    """One process: {"<form> <rows> <hot|cold>": ms} on stdout."""
    from flashrt_structures import ops

    torch.manual_seed(0)
    torch.set_num_threads(2)
    w = torch.randn(N, K) * 0.02
    forms = {"int8_g64_f16": lambda: ops.pack_int8(w, 64, "f16"), "int8": lambda: ops.pack_int8(w),
             "int4_g32_asym_f16": lambda: ops.pack_int4(w, 32, False, "f16")}
    out = {}
    for name, pack in forms.items():
        packs = [pack() for _ in range(PACKS)]
        for m in ROWS:
            x, y = torch.randn(m, K), torch.empty(m, N)
            for p in packs:
                ops.linear(x, p, out=y)
            hot, cold = [], []
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(CALLS):
                    ops.linear(x, packs[0], out=y)
                hot.append((time.perf_counter() - t) / CALLS)
                t = time.perf_counter()
                for p in packs:
                    ops.linear(x, p, out=y)
                cold.append((time.perf_counter() - t) / PACKS)
            out[f"{name} {m} hot"] = statistics.median(hot) * 1e3
            out[f"{name} {m} cold"] = statistics.median(cold) * 1e3
        del packs
    print(json.dumps(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import current_tier, machine, result_path, write_result

    if current_tier() != "amx":
        print(f"the tile path is the amx variant's; this CPU's tier is {current_tier()}")
        return 1
    samples: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for _ in range(args.rounds):
        for arm, cap in ARMS.items():
            env = dict(os.environ, FRT_CPU_CAP=cap)
            done = subprocess.run([sys.executable, __file__, "--child"], env=env, check=True,
                                  capture_output=True, text=True)
            samples[arm].append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = []
    print(f"{'form':>14} {'rows':>4} {'weights':>8} {'tiles ms':>9} {'fma ms':>8} {'ratio':>6}"
          f" {'tiles GMAC/s':>13}")
    for key in samples["tiles"][0]:
        form, m, where = key.split()
        ms = {arm: statistics.median(s[key] for s in samples[arm]) for arm in ARMS}
        gmacs = int(m) * K * N / ms["tiles"] / 1e6
        rows.append({"form": form, "M": int(m), "K": K, "N": N,
                     "weights": "in cache (one pack)" if where == "hot"
                     else f"from DRAM ({PACKS} packs cycled)",
                     "ms_tiles": ms["tiles"], "ms_fma": ms["fma"],
                     "time_ratio_tiles_over_fma": ms["tiles"] / ms["fma"],
                     "tiles_gmac_per_s": gmacs,
                     "samples_ms": {arm: [s[key] for s in samples[arm]] for arm in ARMS}})
        print(f"{form:>14} {m:>4} {where:>8} {ms['tiles']:9.3f} {ms['fma']:8.3f}"
              f" {ms['tiles'] / ms['fma']:6.2f} {gmacs:13.1f}")
    write_result(result_path(args.json, "panel_tiles"), {
        "bench": "weight-only linear at 1..16 rows: the amx variant's AMX-BF16 tile path "
                 "(group forms from 9 rows, per channel from 5) against the avx512vnni "
                 "variant's FMA panels",
        "method": f"paired A/B in alternating processes (FRT_CPU_CAP unset vs avx512vnni), "
                  f"{args.rounds} rounds; per process 5 rounds of {CALLS} calls on one pack and "
                  f"of one call on each of {PACKS} packs; medians; fp32 activations, 2 threads",
        "machine": machine(), "rows": rows})
    return 0


if __name__ == "__main__":
    if "--child" in sys.argv:
        child()
    else:
        sys.exit(main())

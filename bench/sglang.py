"""SGLang with the flashrt door vs plain SGLang: output tokens/s at several concurrencies.

One engine per dtype (sglang 0.5.23 on its torch-native CPU path: `SGLANG_USE_CPU_ENGINE=1`,
attention_backend torch_native, no CUDA graphs, no overlap schedule), built after
`sglang_engine.install(scheme="w8a16_decode", alternates=[...])`, so every arm runs on the same
engine: the host alone (`select(engine, None)`: SGLang's own path, `F.linear` and its logits
matmul), int8 weight-only seats at decode rows (`w8a16_decode`), and the `_all` schemes (int8
and int4 weights against int8 activations per block of 32, at every row count: prefill chunks run
the seats too). Arms alternate, rotating which goes first in each round; each arm is also run with
one new token (its prefill; the decode rate is the rest); figures are medians over rounds, each
ratio the median of per-round ratios. A Qwen3-0.6B-shaped model (its config sizes, random weights
written by save_pretrained), greedy, ignore_eos, every prompt the same length. Beside the figures:
the machine's read bandwidth at the engine's thread count and each arm's bytes-per-token floor.

Run with the SGLang environment (scripts/setup_sglang.sh):
  .venv-sglang/bin/python bench/sglang.py            -> bench/results/<tier>/sglang.json
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
# This file is bench/sglang.py: with its folder on sys.path, `import sglang` would find it.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("_common", HERE / "_common.py")
_common = importlib.util.module_from_spec(_spec)
sys.modules["_common"] = _common  # its dataclasses look their module up while it loads
_spec.loader.exec_module(_common)
machine, write_result = _common.machine, _common.write_result

import torch  # noqa: E402

from flashrt_structures import ops, sglang_engine  # noqa: E402

ARMS = {"sglang": None, "w8": "w8a16_decode", "w8a8_all": "w8a8_all", "w4a8_all": "w4a8_all"}


def run(engine: Any, prompt: int, new: int, concurrency: int, seed: int) -> tuple[float, list]:
    g = torch.Generator().manual_seed(seed)
    batch = [torch.randint(1, 150000, (prompt,), generator=g).tolist()
             for _ in range(concurrency)]
    params = {"max_new_tokens": new, "temperature": 0.0, "ignore_eos": True}
    t = time.perf_counter()
    outs = engine.generate(input_ids=batch, sampling_params=params)
    wall = time.perf_counter() - t
    assert all(len(o["output_ids"]) == new for o in outs)
    return concurrency * new / wall, [list(o["output_ids"]) for o in outs]


def bench_dtype(model: Path, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    import sglang
    sglang_engine.install(scheme="w8a16_decode",
                          alternates=[s for s in ARMS.values() if s not in (None, "w8a16_decode")])
    t = time.perf_counter()
    engine = sglang.Engine(
        model_path=str(model), device="cpu", skip_tokenizer_init=True,
        attention_backend="torch_native", disable_cuda_graph=True, dtype=dtype,
        disable_overlap_schedule=True, mem_fraction_static=0.35,
        max_total_tokens=max(args.concurrency) * (args.prompt + args.new_tokens + 8),
        max_running_requests=max(args.concurrency), log_level="warning", random_seed=0)
    load_s = time.perf_counter() - t
    try:
        (rep,) = sglang_engine.report(engine)
        assert rep["hooked"] and rep["seats"] > 0 and not rep["error"], rep
        seat_bytes = {}
        for arm, scheme in ARMS.items():  # warm every arm, and read each set's bytes
            (r,) = sglang_engine.select(engine, scheme)
            seat_bytes[arm] = r.get("seat_bytes", 0)
            run(engine, 8, 4, 1, 0)
        threads = rep["threads"]
        bandwidth = ops.read_bandwidth_gbps(1 << 30, threads=threads, repeats=5)
        rows = _common.engine_rows(
            ARMS, "sglang", lambda scheme, e=engine: sglang_engine.select(e, scheme),
            lambda prompt, new, c, seed, e=engine: run(e, prompt, new, c, seed), args.concurrency,
            args.rounds, args.prompt, args.new_tokens, dtype)
        (final,) = sglang_engine.select(engine, "w8a16_decode")
        elem = 4 if dtype == "float32" else 2
        host_bytes = _common.qwen3_06b_weight_bytes(args.layers, elem)
        floors = {"sglang": bandwidth * 1e9 / host_bytes,
                  **{a: bandwidth * 1e9 / seat_bytes[a] for a in seat_bytes
                     if a != "sglang" and seat_bytes[a]}}
        return {
            "dtype": dtype, "load_s": load_s, "engine_threads": threads, "scheduler_pid":
            rep["pid"], "read_bandwidth_gbps": bandwidth, "host_weight_bytes": host_bytes,
            "seat_bytes": seat_bytes, "floor_tok_s_c1": floors, "seats": rep["seats"],
            "refused": rep["refused"], "ledger_w8": final["summary"], "rows": rows,
        }
    finally:
        engine.shutdown()
        del engine
        gc.collect()
        sglang_engine.uninstall()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--smoke", action="store_true", help="2 layers, 8 new tokens, c = 1, 4")
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 4, 8, 16])
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    if args.smoke:
        args.layers, args.new_tokens, args.concurrency, args.rounds = 2, 8, [1, 4], 1
    path = _common.result_path(args.json, "sglang")
    results = []
    with tempfile.TemporaryDirectory() as d:
        model = _common.qwen3_06b_checkpoint(args.layers, Path(d) / "qwen3")
        for dtype in args.dtypes.split(","):
            results.append(bench_dtype(model, dtype, args))
    write_result(path, {
        "benchmark": "sglang", "machine": machine(), "model": "Qwen3-0.6B sizes, random weights",
        "layers": args.layers, "command": " ".join(sys.argv), "prompt": args.prompt,
        "new_tokens": args.new_tokens, "greedy": True, "ignore_eos": True,
        "engine": "sglang 0.5.23, torch-native CPU path, spawned scheduler process",
        "timing": "arms alternated per round (rotating first arm); each arm also timed with one "
                  "new token (its prefill; decode rate = the rest); medians; ratio = median of "
                  "per-round ratios",
        "results": results})
    print("\n| dtype | c | SGLang tok/s | " + " | ".join(a for a in ARMS if a != "sglang") + " |")
    print("|---|---|---|" + "---|" * (len(ARMS) - 1))
    for res in results:
        for row in res["rows"]:
            print(f"| {res['dtype']} | {row['concurrency']} | {row['sglang_tok_s']:.2f} | "
                  + " | ".join(f"{row[a + '_tok_s']:.2f} ({row[a + '_vs_sglang']:.2f}x)"
                               for a in ARMS if a != "sglang") + " |")


if __name__ == "__main__":
    main()

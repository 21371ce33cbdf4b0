"""decode_loop on a Qwen3-0.6B-shaped host: prefill and steady decode, against the host.

Qwen3-0.6B's real config sizes (see bench/door.py), random weights, fp32, batch 1, a 128-token
prompt and 128 new tokens, greedy. Arms, alternating round by round in one process:
  host            the host's own forward with its KV cache (prefill one 128-token forward,
                  then one forward per token): what greedy `generate` does, timed per phase
  attached_w8     the same with w8a16_decode seats attached (swap.attach)
  loop_none       decode_loop over the host's own fp32 weights
  loop_w8/_w4     decode_loop over w8a16_decode / w4a16_decode seats (w4: int4 g32 with a min)
  loop_w4_sym     decode_loop over w4a16_sym_decode seats (int4 g32 symmetric)
  loop_w8a8       decode_loop over w8a8_decode seats (int8 activation rows, integer dot products)
  loop_w4a8(_asym) decode_loop over w4a8_decode / w4a8_asym_decode seats (int4 g32 nibbles
                  against int8 activation blocks; the head int8)
The loop prefills in blocks of up to 16 rows in the core. The floor is the bytes one decode step must read
(weights as each arm holds them, and the KV cache at the mean decode position) over the best read
bandwidth sample; the bandwidth drifts on a shared machine, so each arm is also held against the
sample taken just before each of its rounds ("adjacent", median over rounds).

Peers (torchao int8 weight-only; llama.cpp Q8_0/Q4_0 through llama-cpp-python) are optional:
they are measured when importable and reported as not installed otherwise.

    .venv/bin/python bench/decode.py                  # writes bench/results/<tier>/decode.json
    FRT_CPU_CAP=avx2 .venv/bin/python bench/decode.py # the AVX2 tier on an AVX-512 machine
    .venv/bin/python bench/decode.py --model smollm2  # bench/results/<tier>/decode_smollm2.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Callable

import torch

import flashrt_structures as S
from flashrt_structures import ops

from _common import machine, result_path, write_result

PROMPT, NEW = 128, 128


def host_arm(model, prompt, new):
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(prompt, use_cache=True)
        prefill = time.perf_counter() - t0
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        tokens = [int(tok)]
        t0 = time.perf_counter()
        for _ in range(new - 1):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            tokens.append(int(tok))
        decode = time.perf_counter() - t0
    return prefill, decode, tokens


def loop_arm(loop, prompt, new):
    out = loop.generate(prompt, new, eos_token_id=[])
    return loop.timing["prefill_s"], loop.timing["decode_s"], out[0, PROMPT:].tolist()


def llama_arm(llm, prompt, new):
    """llama.cpp through llama-cpp-python: prefill the prompt in one batch, then one token per
    eval, greedy (argmax of the last logits)."""
    import numpy as np

    def last_argmax() -> int:  # llama-cpp-python keeps no scores without logits_all
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))

    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt[0].tolist())
    prefill = time.perf_counter() - t0
    tokens = [last_argmax()]
    t0 = time.perf_counter()
    for _ in range(new - 1):
        llm.eval([tokens[-1]])
        tokens.append(last_argmax())
    return prefill, time.perf_counter() - t0, tokens


def host_weight_bytes(model) -> int:
    return sum(m.weight.numel() * m.weight.element_size()
               for m in model.modules() if isinstance(m, torch.nn.Linear))


SMOL_PROMPTS = ["What is the capital of France?", "Name three primary colors.",
                "Write a haiku about the sea.", "Explain what a CPU cache is.",
                "Give me a recipe for pancakes."]
SMOL_NEW = 64


def smollm2_main(args) -> int:
    """The real model: SmolLM2-135M-Instruct's Q4_1 GGUF. Arms, alternated per prompt: the
    host's greedy generate (fp32, dequantised by transformers), decode_loop over the file's own
    blocks (adopt_prequantized), and llama.cpp on the same file. Greedy agreement of decode_loop
    with llama.cpp over 64 tokens on 5 chat prompts (and over the first 32)."""
    from flashrt_structures import smollm2

    tok, model = smollm2.load()
    path = smollm2.checkpoint()
    prompts = [smollm2.chat_ids(tok, p) for p in SMOL_PROMPTS]
    max_len = max(p.shape[1] for p in prompts) + SMOL_NEW + 8
    report = S.adopt_prequantized(model, "gguf", path)
    loop = S.decode_loop(model, max_len)
    report.handle.detach()  # the loop holds the seats; the host arm runs the plain host
    arms = {"host_generate": lambda p: host_arm(model, p, SMOL_NEW),
            "loop_adopted_q4_1": lambda p: loop_gen(loop, p, SMOL_NEW)}
    peers = {}
    try:
        import llama_cpp

        llm = llama_cpp.Llama(model_path=str(path), n_ctx=max_len, n_batch=max_len,
                              n_threads=os.cpu_count(), logits_all=False, verbose=False)
        arms["llama.cpp_q4_1"] = lambda p: llama_arm(llm, p, SMOL_NEW)
        peers["llama_cpp"] = f"llama-cpp-python {llama_cpp.__version__} on the same GGUF file"
    except ImportError as e:
        peers["llama_cpp"] = f"not measured: {e} (optional peer: pip install llama-cpp-python)"
    want = arm_filter(args.arms)
    # The host and the loop always run: the other arms are judged against them.
    arms = {n: fn for n, fn in arms.items()
            if want(n) or n in ("host_generate", "loop_adopted_q4_1")}
    samples: dict[str, list] = {n: [] for n in arms}
    bandwidth = []
    for _ in range(args.rounds):
        for p in prompts:
            for name, fn in arms.items():
                bandwidth.append(ops.read_bandwidth_gbps(1 << 28, repeats=2))
                samples[name].append(fn(p))
    bw = max(bandwidth)
    rows = []
    print(f"machine: {machine()}")
    print(f"SmolLM2-135M-Instruct ({path.name}), {len(prompts)} chat prompts x {args.rounds} "
          f"rounds, {SMOL_NEW} new tokens greedy; read bandwidth {bw:.1f} GB/s")
    floor = bw * 1e9 / loop.weight_bytes
    for name in arms:
        pre_tok = sum(p.shape[1] for p in prompts) * args.rounds
        pre = sum(s[0] for s in samples[name])
        dec = statistics.median(s[1] / (SMOL_NEW - 1) for s in samples[name])
        row = {"arm": name, "prefill_tok_s": pre_tok / pre, "decode_tok_s": 1 / dec,
               "decode_step_seconds": dec}
        rows.append(row)
    agreement = {}
    if "llama.cpp_q4_1" in samples:
        a64, a32 = [], []
        for mine, theirs in zip(samples["loop_adopted_q4_1"][:len(prompts)],
                                samples["llama.cpp_q4_1"][:len(prompts)]):
            a64.append(sum(x == y for x, y in zip(mine[2], theirs[2])) / SMOL_NEW)
            a32.append(sum(x == y for x, y in zip(mine[2][:32], theirs[2][:32])) / 32)
        agreement = {"loop_vs_llama_cpp_64": statistics.mean(a64),
                     "loop_vs_llama_cpp_first32": statistics.mean(a32), "per_prompt_64": a64}
    host_tokens = [s[2] for s in samples["host_generate"][:len(prompts)]]
    agreement["loop_vs_host_64"] = statistics.mean(
        sum(x == y for x, y in zip(m[2], h)) / SMOL_NEW
        for m, h in zip(samples["loop_adopted_q4_1"][:len(prompts)], host_tokens))
    print(f"{'arm':<20}{'prefill tok/s':>14}{'decode tok/s':>14}{'vs llama.cpp':>14}")
    ref = next((r["decode_tok_s"] for r in rows if r["arm"] == "llama.cpp_q4_1"), None)
    for r in rows:
        vs = f"{r['decode_tok_s'] / ref:>13.2f}x" if ref else f"{'-':>14}"
        print(f"{r['arm']:<20}{r['prefill_tok_s']:>14.1f}{r['decode_tok_s']:>14.1f}{vs}")
    print(f"decode_loop weight bytes/token {loop.weight_bytes / 1e6:.1f} MB: floor {floor:.0f} "
          f"tok/s at {bw:.1f} GB/s; agreement {agreement}")
    write_result(result_path(args.json, "decode_smollm2"), {"bench": "decode_smollm2", "machine": machine(),
                             "read_bandwidth_gbps": bw, "read_bandwidth_samples": bandwidth,
                             "model": path.name, "prompts": SMOL_PROMPTS, "new_tokens": SMOL_NEW,
                             "rounds": args.rounds, "rows": rows, "agreement": agreement,
                             "loop_weight_bytes": loop.weight_bytes, "floor_tok_s": floor,
                             "peers": peers})
    return 0


def loop_gen(loop, prompt, new):
    out = loop.generate(prompt, new, eos_token_id=[])  # ignore eos: every arm decodes `new`
    return loop.timing["prefill_s"], loop.timing["decode_s"], out[0, prompt.shape[1]:].tolist()


def arm_filter(arms: str) -> Callable[[str], bool]:
    """--arms: 'all', or a comma list; the host always runs (the others are judged against it),
    and attached_w8 needs loop_w8's plan."""
    wanted = None if arms == "all" else set(arms.split(",")) | {"host"}

    def want(arm: str) -> bool:
        return wanted is None or arm in wanted or (arm == "loop_w8" and "attached_w8" in wanted)

    return want


def main() -> int:
    from door import qwen3_06b  # the same host as the door benchmark

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=None,
                        help="default bench/results/<tier>/decode.json (decode_smollm2.json)")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", choices=["qwen3-shaped", "smollm2"], default="qwen3-shaped")
    parser.add_argument("--arms", default="all",
                        help="'all' or a comma list of arms to run (the host always runs: the "
                             "other arms' tokens and speedups are judged against it)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    if args.model == "smollm2":
        return smollm2_main(args)

    model = qwen3_06b(args.layers)
    prompt = torch.randint(0, 151936, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    step = prompt[:, :1]
    max_len = PROMPT + NEW
    loop_schemes = {"loop_w8": "w8a16_decode", "loop_w4": "w4a16_decode",
                    "loop_w4_sym": "w4a16_sym_decode",
                    "loop_w8a8": "w8a8_decode", "loop_w4a8": "w4a8_decode",
                    "loop_w4a8_asym": "w4a8_asym_decode"}
    want = arm_filter(args.arms)
    plans = {s: S.auto_swaps(model, lambda: model(step), scheme=s)
             for a, s in loop_schemes.items() if want(a) or s == "w8a16_decode"}
    loops = {"loop_none": S.decode_loop(model, max_len)} if want("loop_none") else {}
    for name, scheme in loop_schemes.items():
        if not want(name):
            continue
        h = plans[scheme].attach(model)
        loops[name] = S.decode_loop(model, max_len)
        h.detach()

    def attached(fn):
        def run():
            h = plans["w8a16_decode"].attach(model)
            try:
                return fn()
            finally:
                h.detach()
        return run

    arms = {
        "host": lambda: host_arm(model, prompt, NEW),
        "attached_w8": attached(lambda: host_arm(model, prompt, NEW)),
        **{name: (lambda l=l: loop_arm(l, prompt, NEW)) for name, l in loops.items()},
    }
    bytes_per_token = {"host": host_weight_bytes(model),
                       **{n: l.weight_bytes for n, l in loops.items()}}
    if "loop_w8" in loops:  # the same seats
        bytes_per_token["attached_w8"] = bytes_per_token["loop_w8"]
    peers = {}
    try:
        import tempfile

        import llama_cpp

        from gguf_export import export_qwen3

        gguf_dir = Path(tempfile.mkdtemp(prefix="frt-gguf-"))
        for quant in [q for q in ("Q8_0", "Q4_0") if want(f"llama.cpp_{q}")]:
            path = export_qwen3(model, gguf_dir / f"qwen3-{quant}.gguf", quant)
            llm = llama_cpp.Llama(model_path=str(path), n_ctx=max_len, n_batch=PROMPT,
                                  n_threads=os.cpu_count(), logits_all=False, verbose=False)
            arms[f"llama.cpp_{quant}"] = lambda llm=llm: llama_arm(llm, prompt, NEW)
            # Every weight is read once per step; the tied embedding is the head.
            bytes_per_token[f"llama.cpp_{quant}"] = path.stat().st_size
        peers["llama_cpp"] = (f"llama-cpp-python {llama_cpp.__version__}: GGUF written from the "
                              "same weights by the gguf package (Q8_0, Q4_0 with a Q8_0 head)")
    except ImportError as e:
        peers["llama_cpp"] = f"not measured: {e} (optional peer: pip install llama-cpp-python gguf)"
    try:
        if not want("torchao_int8"):
            raise ImportError("not in --arms")
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        peer = qwen3_06b(args.layers)  # same seed: the same weights
        assert torch.equal(peer.lm_head.weight, model.lm_head.weight)
        quantize_(peer, Int8WeightOnlyConfig())
        arms["torchao_int8"] = lambda: host_arm(peer, prompt, NEW)
        bytes_per_token["torchao_int8"] = sum(
            m.weight.numel() for m in peer.modules() if isinstance(m, torch.nn.Linear)) + sum(
            m.out_features * 4 for m in peer.modules() if isinstance(m, torch.nn.Linear))
        peers["torchao"] = "int8 weight-only (quantize_, Int8WeightOnlyConfig), eager"
    except ImportError:
        peers["torchao"] = "not installed (optional peer: pip install torchao)"
    arms = {n: fn for n, fn in arms.items() if want(n)}
    samples: dict[str, list] = {n: [] for n in arms}
    bandwidth, adjacent = [], {n: [] for n in arms}
    for _ in range(args.rounds):
        for name, fn in arms.items():  # the machine's bandwidth drifts: sample it between arms
            bandwidth.append(ops.read_bandwidth_gbps(1 << 30, repeats=2))
            adjacent[name].append(bandwidth[-1])
            samples[name].append(fn())
    bw = max(bandwidth)
    # A decode step also reads the KV cache of every layer up to its position: on average the
    # cache at PROMPT + NEW / 2 positions, K and V, fp32 for torch and the loops, f16 in
    # llama.cpp (its default cache type).
    cfg = model.config
    kv_floats = 2 * args.layers * cfg.num_key_value_heads * cfg.head_dim * (PROMPT + NEW // 2)
    kv_bytes = {n: kv_floats * (2 if n.startswith("llama.cpp") else 4) for n in arms}
    host_tokens = samples["host"][0][2]
    host_decode = statistics.median(s[1] for s in samples["host"]) / (NEW - 1)
    rows = []
    print(f"machine: {os.cpu_count()} cores, read bandwidth {bw:.1f} GB/s "
          f"(samples {', '.join(f'{b:.1f}' for b in bandwidth)}), kernels on {S.PARALLEL_BACKEND}")
    print(f"Qwen3-0.6B-shaped, {args.layers} layers, fp32, batch 1, prompt {PROMPT}, new {NEW}")
    print("floor: (weight + mean KV-cache bytes per step) / best bandwidth sample; 'adjacent': "
          "each round against the sample taken just before it, median")
    print(f"{'arm':<15}{'prefill tok/s':>14}{'decode tok/s':>14}{'vs host':>9}{'floor tok/s':>13}"
          f"{'of floor':>10}{'adjacent':>10}{'tokens = host':>15}")
    for name in arms:
        pre = statistics.median(s[0] for s in samples[name])
        dec = statistics.median(s[1] for s in samples[name]) / (NEW - 1)
        nbytes = bytes_per_token[name]
        step_bytes = nbytes + kv_bytes[name]
        floor = bw * 1e9 / step_bytes
        adjacent_frac = statistics.median(
            step_bytes / (s[1] / (NEW - 1)) / (b * 1e9)
            for s, b in zip(samples[name], adjacent[name]))
        same = sum(a == b for a, b in zip(samples[name][0][2], host_tokens)) / NEW
        row = {"arm": name, "prefill_tok_s": PROMPT / pre, "prefill_seconds": pre,
               "decode_tok_s": 1 / dec, "decode_step_seconds": dec,
               "decode_speedup_vs_host": host_decode / dec, "weight_bytes_per_token": nbytes,
               "kv_bytes_per_step": kv_bytes[name], "floor_tok_s": floor,
               "frac_of_floor": (1 / dec) / floor,
               "frac_of_weight_floor": (1 / dec) / (bw * 1e9 / nbytes),
               "frac_of_adjacent_floor": adjacent_frac,
               "adjacent_bandwidth_gbps": adjacent[name],
               "greedy_tokens_same_as_host": same}
        rows.append(row)
        print(f"{name:<15}{row['prefill_tok_s']:>14.1f}{row['decode_tok_s']:>14.2f}"
              f"{row['decode_speedup_vs_host']:>8.2f}x{floor:>13.1f}{row['frac_of_floor']:>10.0%}"
              f"{adjacent_frac:>10.0%}{same:>15.0%}")
    # Teacher-forced top-1 agreement: every loop fed the host's own greedy sequence, its argmax
    # after each prefix against the host's, over the generated positions.
    seq = torch.tensor([prompt[0].tolist() + host_tokens[:-1]])
    with torch.no_grad():
        host_next = model(seq).logits[0].argmax(-1).tolist()
    agreement = {}
    for name, lp in loops.items():
        mine = lp.teacher_forced(seq)
        span = range(PROMPT - 1, seq.shape[1])
        agreement[name] = sum(mine[i] == host_next[i] for i in span) / len(span)
        next(r for r in rows if r["arm"] == name)["teacher_forced_top1"] = agreement[name]
    print("teacher-forced top-1 agreement with the host: " +
          ", ".join(f"{k} {v:.3f}" for k, v in agreement.items()))
    print(f"peers: {peers}")
    result = {"machine": machine(),
              "read_bandwidth_gbps": bw, "read_bandwidth_samples": bandwidth,
              "layers": args.layers, "prompt": PROMPT, "new_tokens": NEW, "rounds": args.rounds,
              "rows": rows, "peers": peers}
    write_result(result_path(args.json, "decode"), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

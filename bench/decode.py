"""decode_loop on a Qwen3-0.6B-shaped host: prefill and steady decode, against the host.

Qwen3-0.6B's real config sizes (see bench/door.py), random weights, fp32, batch 1, a 128-token
prompt and 128 new tokens, greedy. Arms, alternating round by round in one process:
  host            the host's own forward with its KV cache (prefill one 128-token forward,
                  then one forward per token): what greedy `generate` does, timed per phase
  attached_w8     the same with w8a16_decode seats attached (swap.attach)
  loop_none       decode_loop over the host's own fp32 weights
  loop_w8/_w4     decode_loop over w8a16_decode / w4a16_decode seats
The loop prefills token by token in the core. The floor is the bytes one decode step must read
(weights as each arm holds them) over the measured read bandwidth.

Peers (torchao int8 weight-only; llama.cpp Q8_0/Q4_0 through llama-cpp-python) are optional:
they are measured when importable and reported as not installed otherwise.

    .venv/bin/python bench/decode.py --json bench/results/decode.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path

import torch

import flashrt_structures as S
from flashrt_structures import ops

from _common import machine, write_result

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
    out = loop.generate(prompt, new)
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


def main() -> int:
    from door import qwen3_06b  # the same host as the door benchmark

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)

    model = qwen3_06b(args.layers)
    prompt = torch.randint(0, 151936, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    step = prompt[:, :1]
    max_len = PROMPT + NEW
    plans = {s: S.auto_swaps(model, lambda: model(step), scheme=s)
             for s in ("w8a16_decode", "w4a16_decode")}
    loops = {"loop_none": S.decode_loop(model, max_len)}
    for scheme, name in (("w8a16_decode", "loop_w8"), ("w4a16_decode", "loop_w4")):
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
    bytes_per_token = {"host": host_weight_bytes(model), "attached_w8": None,
                       **{n: l.weight_bytes for n, l in loops.items()}}
    bytes_per_token["attached_w8"] = bytes_per_token["loop_w8"]
    peers = {}
    try:
        import tempfile

        import llama_cpp

        from gguf_export import export_qwen3

        gguf_dir = Path(tempfile.mkdtemp(prefix="frt-gguf-"))
        for quant in ("Q8_0", "Q4_0"):
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
    samples: dict[str, list] = {n: [] for n in arms}
    bandwidth = []
    for _ in range(args.rounds):
        for name, fn in arms.items():  # the machine's bandwidth drifts: sample it between arms
            bandwidth.append(ops.read_bandwidth_gbps(1 << 30, repeats=2))
            samples[name].append(fn())
    bw = max(bandwidth)
    host_tokens = samples["host"][0][2]
    host_decode = statistics.median(s[1] for s in samples["host"]) / (NEW - 1)
    rows = []
    print(f"machine: {os.cpu_count()} cores, read bandwidth {bw:.1f} GB/s "
          f"(samples {', '.join(f'{b:.1f}' for b in bandwidth)}), kernels on {S.PARALLEL_BACKEND}")
    print(f"Qwen3-0.6B-shaped, {args.layers} layers, fp32, batch 1, prompt {PROMPT}, new {NEW}")
    print(f"{'arm':<13}{'prefill tok/s':>14}{'decode tok/s':>14}{'vs host':>9}{'floor tok/s':>13}"
          f"{'of floor':>10}{'tokens = host':>15}")
    for name in arms:
        pre = statistics.median(s[0] for s in samples[name])
        dec = statistics.median(s[1] for s in samples[name]) / (NEW - 1)
        nbytes = bytes_per_token[name]
        floor = bw * 1e9 / nbytes
        same = sum(a == b for a, b in zip(samples[name][0][2], host_tokens)) / NEW
        row = {"arm": name, "prefill_tok_s": PROMPT / pre, "prefill_seconds": pre,
               "decode_tok_s": 1 / dec, "decode_step_seconds": dec,
               "decode_speedup_vs_host": host_decode / dec, "weight_bytes_per_token": nbytes,
               "floor_tok_s": floor, "frac_of_floor": (1 / dec) / floor,
               "greedy_tokens_same_as_host": same}
        rows.append(row)
        print(f"{name:<13}{row['prefill_tok_s']:>14.1f}{row['decode_tok_s']:>14.2f}"
              f"{row['decode_speedup_vs_host']:>8.2f}x{floor:>13.1f}{row['frac_of_floor']:>10.0%}"
              f"{same:>15.0%}")
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
    write_result(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

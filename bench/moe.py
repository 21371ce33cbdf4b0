"""Routed experts through the transformers door on a Qwen3-30B-A3B-shaped host: prefill and steady
decode, the host's forward against the same host with seats (w8, w4) and decode_loop over seats
(w8, w4, w8a8, w4a8), and llama.cpp on a GGUF of the same weights (Q8_0, Q4_0), beside the floor.

Qwen3-30B-A3B's real widths (hidden 2048, 32 query / 4 KV heads of 128, 128 experts, top-8,
moe_intermediate_size 768, vocabulary 151936 untied, norm_topk_prob) with random weights, fp32,
batch 1, truncated to --layers layers (default 3: the fp32 host holds 2.4 GB of experts per
layer and 2.5 GB of embedding and head, and four schemes' packs sit beside it in 24 GB).
Prefill is one forward over a 64-token prompt; steady decode is greedy steps over the KV cache,
timed per step (median). Arms alternate round by round in one process; the same weights serve
every arm (an arm's seats are attached for its turn only). The floor is the bytes one decode
step reads, its active experts only (top-k of each bank, packed or at host dtype), attention,
router and head, over the read bandwidth that brackets the arm's turn (a probe just before it and
one just after; the fraction is the median over the rounds whose two probes agree within 20%,
as bench/decode.py holds its figures, docs/benchmarks.md). Beside
each arm: its greedy tokens against the host's and the cosine of its logits on one decode step.
llama.cpp (llama-cpp-python, an optional peer) reads a GGUF that bench/gguf_export.py writes from
the same weights (banks and projections Q8_0 or Q4_0, head and embedding Q8_0, routers F32); its
bytes per token count the file's tensors a step reads (active experts only) as the others do.

    .venv/bin/python bench/moe.py            # -> bench/results/<tier>/moe.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

import flashrt_structures as S
from flashrt_structures import ops
from flashrt_structures.block_seats import BlockSeatModule
from flashrt_structures.seats import BankSeat

from _common import Bracket, llama_logits, machine, probe, result_path, summarize, write_result
from door import run_arm

PROMPT, NEW = 64, 32
DOOR_SCHEMES = ("w8a16_decode", "w4a16_decode")  # the door's arms (host forward + seats)
LOOP_SCHEMES = ("w8a16_decode", "w4a16_decode", "w8a8_decode", "w4a8_decode")  # decode_loop's


def qwen3_30b_a3b(layers: int) -> Qwen3MoeForCausalLM:
    cfg = Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                         moe_intermediate_size=768, num_hidden_layers=layers,
                         num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                         num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         rope_theta=1000000.0, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(cfg).eval()


def step_bytes(model: Qwen3MoeForCausalLM, swaps: dict | None) -> int:
    """Bytes one decode step reads from weights: each bank's top-k experts (packed where
    seated), every other projection (packed where seated) and the routers; the input
    embedding reads one row and is not counted."""
    top_k, experts = model.config.num_experts_per_tok, model.config.num_experts
    # A decoder block streams nothing of its own: its parts are seats of the same plan (its
    # router's copy reads the router's bytes, counted below with the host's routers).
    seated = {k: v for k, v in (swaps or {}).items() if not isinstance(v, BlockSeatModule)}
    total = 0
    for name, mod in model.named_modules():
        if name in seated:
            seat = seated[name]
            nbytes = seat.seat.nbytes
            total += nbytes * top_k // experts if isinstance(seat, BankSeat) else nbytes
            continue
        if any(name.startswith(s + ".") for s in seated):
            continue
        if isinstance(mod, torch.nn.Linear):
            total += mod.weight.numel() * mod.weight.element_size()
        elif hasattr(mod, "gate_up_proj") and hasattr(mod, "down_proj"):  # a host bank
            per = (mod.gate_up_proj[0].numel() + mod.down_proj[0].numel())
            total += per * top_k * mod.down_proj.element_size()
        elif name.endswith(".gate") and isinstance(getattr(mod, "weight", None), torch.Tensor):
            total += mod.weight.numel() * mod.weight.element_size()  # a router
    return total


def loop_arm(loop, prompt: torch.Tensor, new: int) -> dict:
    """decode_loop: the core prefills the prompt (blocks of 16 rows), then one step a token."""
    ids = prompt[0].tolist()
    t0 = time.perf_counter()
    token = loop.program.prefill(ids, 0)
    prefill = time.perf_counter() - t0
    tokens, steps = [token], []
    for pos in range(len(ids), len(ids) + new - 1):
        t0 = time.perf_counter()
        token = loop.program.step(token, pos)
        steps.append(time.perf_counter() - t0)
        tokens.append(token)
    return {"prefill_s": prefill, "decode_step_s": statistics.median(steps) if steps else 0.0,
            "tokens": tokens}


def run(arm: dict, model, prompt: torch.Tensor, new: int) -> dict:
    """One arm's turn: its loop, or the host with the arm's seats attached for the turn."""
    if "loop" in arm:
        return loop_arm(arm["loop"], prompt, new)
    if "llama" in arm:
        return llama_arm(arm["llama"], prompt, new)
    handle = arm["plan"].attach(model) if arm["swaps"] else None
    try:
        out = run_arm(model, prompt, new)
        if handle is not None:
            arm["summary"] = handle.summary()
        return out
    finally:
        if handle is not None:
            handle.detach()


def llama_arm(llm, prompt: torch.Tensor, new: int) -> dict:
    """llama.cpp: prefill the prompt in one batch, then one eval a token, greedy on the last
    logits."""

    def argmax() -> int:
        return int(llama_logits(llm).argmax())

    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt[0].tolist())
    prefill = time.perf_counter() - t0
    tokens, steps = [argmax()], []
    for _ in range(new - 1):
        t0 = time.perf_counter()
        llm.eval([tokens[-1]])
        tokens.append(argmax())
        steps.append(time.perf_counter() - t0)
    return {"prefill_s": prefill, "decode_step_s": statistics.median(steps) if steps else 0.0,
            "tokens": tokens}


def gguf_step_bytes(path: Path, top_k: int, experts: int) -> int:
    """Bytes of a GGUF file's tensors one decode step reads: a bank's top-k experts, every other
    tensor whole, the token embedding not at all (one row)."""
    import gguf

    total = 0
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.name == "token_embd.weight":
            continue
        share = top_k / experts if "_exps." in t.name else 1.0
        total += int(t.n_bytes * share)
    return total


def llama_arms(model, arms: dict, max_len: int, step: torch.Tensor, want: torch.Tensor) -> str:
    """Adds llama.cpp arms (Q8_0, Q4_0) over GGUFs of the model's weights, each with the cosine
    of its logits to the host's on the one-token call `step`; says what ran."""
    try:
        import tempfile

        import llama_cpp

        from decode import llama_isa
        from gguf_export import export_qwen3_moe
    except ImportError as e:
        return f"not measured: {e} (optional peer: pip install llama-cpp-python gguf)"
    cfg = model.config
    folder = Path(tempfile.mkdtemp(prefix="frt-gguf-moe-"))
    for quant in ("Q8_0", "Q4_0"):
        t0 = time.perf_counter()
        path = export_qwen3_moe(model, folder / f"qwen3moe-{quant}.gguf", quant)
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=max_len, n_batch=PROMPT,
                              n_threads=os.cpu_count(), logits_all=False, verbose=False)
        llm.reset()
        llm.eval(step[0].tolist())
        arms[f"llama.cpp {quant}"] = {
            "llama": llm, "swaps": None, "bind_s": time.perf_counter() - t0,
            "logits_cosine": cosine(llama_logits(llm), want),
            "bytes": gguf_step_bytes(path, cfg.num_experts_per_tok, cfg.num_experts)}
    return (f"llama-cpp-python {llama_cpp.__version__}: GGUF (qwen3moe) written from the same "
            "weights by the gguf package; " + llama_isa(llama_cpp))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(),
                                                       b.flatten().double(), dim=0))


def vs_llama(rows: list[dict]) -> dict:
    """decode_loop's decode against llama.cpp's at the same bits (w8 schemes against Q8_0, w4
    schemes against Q4_0)."""
    by = {r["arm"]: r["decode_tok_s"] for r in rows}
    out = {}
    for scheme in LOOP_SCHEMES:
        peer = by.get("llama.cpp Q8_0" if scheme.startswith("w8") else "llama.cpp Q4_0")
        if peer and f"decode_loop {scheme}" in by:
            out[f"decode_loop {scheme}"] = by[f"decode_loop {scheme}"] / peer
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5, help=f"decode rounds ({NEW} steps each)")
    parser.add_argument("--prefill-rounds", type=int, default=3)
    args = parser.parse_args()

    t0 = time.perf_counter()
    model = qwen3_30b_a3b(args.layers)
    build_s = time.perf_counter() - t0
    prompt = torch.randint(0, 151936, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    step = torch.randint(0, 151936, (1, 1), generator=torch.Generator().manual_seed(2))
    fwd = lambda: model(step)  # noqa: E731  (one decode-shaped call to observe)
    with torch.no_grad():
        want = model(step).logits
    arms: dict[str, dict] = {"host": {"swaps": None}}
    plans: dict[str, dict] = {}
    for scheme in LOOP_SCHEMES:
        t0 = time.perf_counter()
        plan = S.auto_swaps(model, fwd, scheme=scheme)
        plans[scheme] = {"plan": plan, "swaps": plan.swaps, "bind_s": time.perf_counter() - t0}
        handle = plan.attach(model)
        try:
            with torch.no_grad():
                plans[scheme]["logits_cosine"] = cosine(model(step).logits, want)
        finally:
            handle.detach()
        print(S.explain(plan))
    for scheme in DOOR_SCHEMES:
        arms[scheme] = dict(plans[scheme])
    # decode_loop over each scheme's seats (the loop keeps the packs it reads after detach).
    for scheme in LOOP_SCHEMES:
        handle = plans[scheme]["plan"].attach(model)
        try:
            loop = S.decode_loop(model, PROMPT + NEW + 8)
        finally:
            handle.detach()
        # Its logits' cosine to the host: the door's on the same packs (its self-check compares
        # it with the seated host).
        arms[f"decode_loop {scheme}"] = {"loop": loop, "swaps": plans[scheme]["swaps"],
                                         "bind_s": plans[scheme]["bind_s"],
                                         "self_check": dict(loop.self_check),
                                         "logits_cosine": plans[scheme]["logits_cosine"]}
    llama_cpp_peer = llama_arms(model, arms, PROMPT + NEW + 8, step, want)
    warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated",
                            category=FutureWarning)
    for arm in arms.values():  # warm-up: first-call allocations, caches, thread start
        if "loop" in arm:
            loop_arm(arm["loop"], prompt[:, :8], 3)
            continue
        if "llama" in arm:
            llama_arm(arm["llama"], prompt[:, :8], 3)
            continue
        handle = arm["plan"].attach(model) if arm["swaps"] else None
        run_arm(model, prompt[:, :8], 3)
        if handle is not None:
            handle.detach()

    def rotated(r: int) -> list[tuple[str, dict]]:
        items = list(arms.items())
        return items[r % len(items):] + items[:r % len(items)]

    bw_before = ops.read_bandwidth_gbps(1 << 30, repeats=5)
    prefills: dict[str, list[float]] = {name: [] for name in arms}
    samples: dict[str, list[dict]] = {name: [] for name in arms}
    for r in range(args.prefill_rounds):
        for name, arm in rotated(r):
            prefills[name].append(run(arm, model, prompt, 1)["prefill_s"])
    for r in range(args.rounds):
        for name, arm in rotated(r):
            before = probe()
            sample = run(arm, model, prompt, NEW)
            sample["probes"] = (before, probe())
            samples[name].append(sample)
    bw_after = ops.read_bandwidth_gbps(1 << 30, repeats=5)

    host_pre = statistics.median(prefills["host"])
    host_step = statistics.median(s["decode_step_s"] for s in samples["host"])
    host_tokens = samples["host"][0]["tokens"]
    m = machine()
    print(f"machine: {m['cpu']} ({m['cpu_id']}), tier {m['tier']}, {m['cores']} cores; read "
          f"bandwidth {bw_before:.1f} GB/s before, {bw_after:.1f} after")
    print(f"Qwen3-30B-A3B-shaped, {args.layers} layers, fp32 host, prompt {PROMPT}, decode {NEW}")
    print(f"{'arm':<28}{'prefill tok/s':>14}{'vs host':>9}{'decode tok/s':>14}{'vs host':>9}"
          f"{'MB/token':>10}{'floor tok/s':>13}{'of floor':>10}{'same tokens':>13}{'cosine':>9}")
    rows = []
    for name, arm in arms.items():
        pre = statistics.median(prefills[name])
        stp = statistics.median(s["decode_step_s"] for s in samples[name])
        nbytes = (arm["loop"].weight_bytes if "loop" in arm else arm["bytes"] if "llama" in arm
                  else step_bytes(model, arm["swaps"]))
        held = summarize([Bracket(nbytes / s["decode_step_s"] / 1e9, *s["probes"])
                          for s in samples[name]])
        floor = held["bandwidth_gbps"] * 1e9 / nbytes
        same = sum(a == b for a, b in zip(samples[name][0]["tokens"], host_tokens)) / NEW
        cos = arm.get("logits_cosine", 1.0)
        notes = arm["plan"].notes if arm.get("plan") else {"refused": []}
        row = {"arm": name, "seats": arm.get("summary", {}).get("seams", 0),
               "refused": len(notes["refused"]), "prefill_tok_s": PROMPT / pre,
               "prefill_vs_host": host_pre / pre, "decode_tok_s": 1 / stp,
               "decode_vs_host": host_step / stp, "weight_bytes_per_token": nbytes,
               "floor_tok_s": floor, "frac_of_floor": held["frac_of_bandwidth"],
               "floor_brackets": held,
               "greedy_tokens_same_as_host": same, "logits_cosine": cos,
               "ledger": arm.get("summary", {}), "bind_seconds": arm.get("bind_s", 0.0),
               "self_check": arm.get("self_check"),
               "prefill_samples_s": prefills[name],
               "decode_step_samples_s": [s["decode_step_s"] for s in samples[name]]}
        rows.append(row)
        print(f"{name:<28}{PROMPT / pre:>14.1f}{row['prefill_vs_host']:>8.2f}x{1 / stp:>14.2f}"
              f"{row['decode_vs_host']:>8.2f}x{nbytes / 1e6:>10.1f}{floor:>13.1f}"
              f"{row['frac_of_floor']:>10.0%}{same:>13.0%}{cos:>9.5f}")
    for name, ratio in vs_llama(rows).items():
        print(f"{name} vs llama.cpp at the same bits: {ratio:.2f}x")
    print(f"llama.cpp: {llama_cpp_peer}")
    result = {"machine": m, "read_bandwidth_gbps": {"before": bw_before, "after": bw_after},
              "host": "Qwen3-30B-A3B-shaped (hidden 2048, 32/4 heads of 128, 128 experts, top-8, "
                      "moe_intermediate 768, vocab 151936, norm_topk_prob), random weights, fp32",
              "layers": args.layers, "build_seconds": build_s, "prompt": PROMPT,
              "new_tokens": NEW, "rounds": args.rounds, "prefill_rounds": args.prefill_rounds,
              "rows": rows, "peers": {"llama_cpp": llama_cpp_peer},
              "vs_llama_cpp": vs_llama(rows),
              "vllm": "bench/vllm.py --moe -> vllm_moe.json"}
    write_result(result_path(args.json, "moe"), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

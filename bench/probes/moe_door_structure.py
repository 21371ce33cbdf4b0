"""The door on a routed-MoE host with and without one structure's seats (--structure:
attention_core, decoder_block, ...): the same scheme's plan twice, one of them without that
structure, and the host's own forward, taking turns round by round in one process on one host
(each plan attached for its turn only, its own cache), so the machine's drift lands on all. Per
arm the median decode step; per round the ratio of the two plans; the greedy tokens of each
against the host's. The host (--host) is bench/moe.py's Qwen3-30B-A3B shape or a
Qwen1.5-MoE-A2.7B shape (hidden 2048, 16 heads of 128 with q/k/v biases, 60 experts of 1408,
top-4 without renormalising, a shared expert of 5632 behind its sigmoid gate, vocabulary
151936), random weights, fp32, truncated to --layers layers. A probe for one change (the
routed-MoE families' attention seated: the comment on KNOWN_KWARGS in observe/attention.py; the
routed layers as decoder blocks, with a shared expert or without: Note [Routed decoder block]),
not a floor figure: those are bench/moe.py's.

    .venv/bin/python bench/probes/moe_door_structure.py --structure attention_core \
        --json bench/results/amx/moe_door_attention.json
    .venv/bin/python bench/probes/moe_door_structure.py --structure decoder_block \
        --json bench/results/amx/moe_door_blocks.json
    .venv/bin/python bench/probes/moe_door_structure.py --structure decoder_block \
        --host qwen1_5_moe_a2_7b --scheme w8a16_decode \
        --json bench/results/amx/moe_door_blocks_shared_expert.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

import flashrt_structures as S

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from moe import qwen3_30b_a3b  # noqa: E402

from _common import machine, probe, write_result  # noqa: E402
from door import run_arm  # noqa: E402

PROMPT, NEW = 64, 32


def qwen1_5_moe_a2_7b(layers: int) -> Qwen2MoeForCausalLM:
    cfg = Qwen2MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=5632,
                         moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                         num_hidden_layers=layers, num_attention_heads=16,
                         num_key_value_heads=16, num_experts=60, num_experts_per_tok=4,
                         norm_topk_prob=False, decoder_sparse_step=1,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         rope_theta=1000000.0, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    return Qwen2MoeForCausalLM(cfg).eval()


HOSTS = {"qwen3_30b_a3b": qwen3_30b_a3b, "qwen1_5_moe_a2_7b": qwen1_5_moe_a2_7b}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--scheme", default="w4a16_decode")
    parser.add_argument("--structure", default="attention_core",
                        help="the structure one arm plans without")
    parser.add_argument("--host", default="qwen3_30b_a3b", choices=sorted(HOSTS))
    args = parser.parse_args()
    with_, without = f"with_{args.structure}", f"without_{args.structure}"
    warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated",
                            category=FutureWarning)

    model = HOSTS[args.host](args.layers)
    prompt = torch.randint(0, 151936, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    step = torch.randint(0, 151936, (1, 1), generator=torch.Generator().manual_seed(2))
    every = S.list_structures()
    if args.structure not in every:
        parser.error(f"--structure {args.structure}: the catalog holds {', '.join(every)}")
    plans = {
        with_: S.auto_swaps(model, lambda: model(step), scheme=args.scheme),
        without: S.auto_swaps(model, lambda: model(step), scheme=args.scheme,
                              structures=[s for s in every if s != args.structure]),
    }
    seated = {name: sum(sp.seam.structure == args.structure for sp in plan.seams)
              for name, plan in plans.items()}
    host_tokens = run_arm(model, prompt, NEW)["tokens"]
    arms: dict[str, Any] = {"host": None, **plans}  # a plan, or None for the host alone
    steps: dict[str, list[float]] = {name: [] for name in arms}
    tokens: dict[str, list[int]] = {}
    probes = []
    for r in range(args.rounds + 1):  # round 0 warms both arms up and is not kept
        order = list(arms) if r % 2 == 0 else list(arms)[::-1]
        before = probe()
        for name in order:
            plan = arms[name]
            handle = plan.attach(model) if plan is not None else None
            try:
                out = run_arm(model, prompt, NEW)
            finally:
                if handle is not None:
                    handle.detach()
            if r:
                steps[name].append(out["decode_step_s"])
            tokens[name] = out["tokens"]
        probes.append((before, probe()))
    ratios = [a / b for a, b in zip(steps[without], steps[with_])]
    result = {
        "machine": machine(), "host": args.host, "layers": args.layers, "scheme": args.scheme,
        "rounds": args.rounds,
        "prompt": PROMPT, "new_tokens": NEW, "structure": args.structure,
        "structure_seats": seated, "probes_gbps": probes,
        "arms": {name: {"decode_step_ms": statistics.median(s) * 1e3,
                        "decode_tok_s": 1 / statistics.median(s),
                        "step_ms_per_round": [t * 1e3 for t in s],
                        "greedy_tokens_same_as_host": sum(
                            a == b for a, b in zip(tokens[name], host_tokens)) / NEW}
                 for name, s in steps.items()},
        "speedup_with": {"median": statistics.median(ratios),
                         "min": min(ratios), "max": max(ratios)},
        "vs_host": {name: statistics.median(h / t for h, t in zip(steps["host"], s))
                    for name, s in steps.items() if name != "host"},
    }
    for name, arm in result["arms"].items():
        print(f"{name:30s} {args.structure} seats {seated.get(name, 0)}: "
              f"{arm['decode_step_ms']:.2f} ms a step "
              f"({arm['decode_tok_s']:.2f} tok/s), same tokens as host "
              f"{arm['greedy_tokens_same_as_host']:.0%}")
    sp = result["speedup_with"]
    print(f"with / without {args.structure} seats: {sp['median']:.3f}x (rounds {sp['min']:.3f}-"
          f"{sp['max']:.3f}); against the host: " + ", ".join(
              f"{name} {v:.2f}x" for name, v in result["vs_host"].items()))
    if args.json is not None:
        write_result(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

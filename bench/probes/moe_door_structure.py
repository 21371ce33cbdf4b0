"""The door on the Qwen3-30B-A3B-shaped MoE host (bench/moe.py's) with and without one structure's
seats (--structure: attention_core, decoder_block, ...): the same scheme's plan twice, one of them
without that structure, taking turns round by round in one process on one host (each attached
for its turn only, its own cache), so the machine's drift lands on both. Per arm the median
decode step; per round the ratio of the two; the greedy tokens of both against the host's. A
probe for one change (the routed-MoE families' attention seated: the comment on KNOWN_KWARGS in
observe/attention.py; the routed layers as decoder blocks: Note [Routed decoder block]), not a
floor figure: those are bench/moe.py's.

    .venv/bin/python bench/probes/moe_door_structure.py --structure attention_core \
        --json bench/results/amx/moe_door_attention.json
    .venv/bin/python bench/probes/moe_door_structure.py --structure decoder_block \
        --json bench/results/amx/moe_door_blocks.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import torch

import flashrt_structures as S

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from moe import qwen3_30b_a3b  # noqa: E402

from _common import machine, probe, write_result  # noqa: E402
from door import run_arm  # noqa: E402

PROMPT, NEW = 64, 32


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--scheme", default="w4a16_decode")
    parser.add_argument("--structure", default="attention_core",
                        help="the structure one arm plans without")
    args = parser.parse_args()
    with_, without = f"with_{args.structure}", f"without_{args.structure}"
    warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated",
                            category=FutureWarning)

    model = qwen3_30b_a3b(args.layers)
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
    steps: dict[str, list[float]] = {name: [] for name in plans}
    tokens: dict[str, list[int]] = {}
    probes = []
    for r in range(args.rounds + 1):  # round 0 warms both arms up and is not kept
        order = list(plans) if r % 2 == 0 else list(plans)[::-1]
        before = probe()
        for name in order:
            handle = plans[name].attach(model)
            try:
                out = run_arm(model, prompt, NEW)
            finally:
                handle.detach()
            if r:
                steps[name].append(out["decode_step_s"])
            tokens[name] = out["tokens"]
        probes.append((before, probe()))
    ratios = [a / b for a, b in zip(steps[without], steps[with_])]
    result = {
        "machine": machine(), "layers": args.layers, "scheme": args.scheme, "rounds": args.rounds,
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
    }
    for name, arm in result["arms"].items():
        print(f"{name:30s} {args.structure} seats {seated[name]}: "
              f"{arm['decode_step_ms']:.2f} ms a step "
              f"({arm['decode_tok_s']:.2f} tok/s), same tokens as host "
              f"{arm['greedy_tokens_same_as_host']:.0%}")
    sp = result["speedup_with"]
    print(f"with / without {args.structure} seats: {sp['median']:.3f}x (rounds {sp['min']:.3f}-"
          f"{sp['max']:.3f})")
    if args.json is not None:
        write_result(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

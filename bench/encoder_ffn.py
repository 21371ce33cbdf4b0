"""encoder_ffn against today's projection seats: the paired decode step on GELU-MLP hosts.

Two host families from their config classes with random weights, fp32, batch 1: Phi at
Phi-1.5's widths (hidden 2048, intermediate 8192, 32 heads, vocabulary 51200; --phi-layers
layers) and GPT-NeoX at Pythia-410M's (hidden 1024, intermediate 4096, 16 heads, vocabulary
50304, 24 layers). Arms, alternating round by round in one process with the order rotated:
the host; each scheme with the MLPs as two linear_proj seats (structures without encoder_ffn,
what the door did before encoder_ffn existed); each scheme with every MLP one fused encoder_ffn
seat. Per arm: the median decode step over the KV cache, the weight bytes one step reads and the
floor they set at the measured read bandwidth, and the last-position logit cosine against the host.

    .venv/bin/python bench/encoder_ffn.py --json bench/results/encoder_ffn.json
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from pathlib import Path

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, PhiConfig, PhiForCausalLM

import flashrt_structures as S
from flashrt_structures import ops

from _common import machine, write_result
from door import run_arm, weight_bytes

PROMPT, NEW = 32, 32
PROJECTIONS = ["linear_proj", "lm_head"]  # the door before encoder_ffn: MLPs as two projections


def phi(layers: int) -> PhiForCausalLM:
    torch.manual_seed(0)
    cfg = PhiConfig(vocab_size=51200, hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=layers, num_attention_heads=32, hidden_act="gelu_new",
                    max_position_embeddings=2048)
    return PhiForCausalLM(cfg).eval()


def neox(layers: int) -> GPTNeoXForCausalLM:
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=50304, hidden_size=1024, intermediate_size=4096,
                        num_hidden_layers=layers, num_attention_heads=16, hidden_act="gelu",
                        max_position_embeddings=2048)
    return GPTNeoXForCausalLM(cfg).eval()


def bench_host(name: str, model, rounds: int, bandwidth: float) -> dict:
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    step = torch.randint(0, vocab, (1, 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(prompt[:, :16]).logits[0, -1]  # 16 rows: inside the decode band
    arms: dict[str, dict] = {"host": {"plan": None}}
    for scheme in ("w8a16_decode", "w4a16_decode"):
        for label, structures in (("projections", PROJECTIONS), ("encoder_ffn", None)):
            plan = S.auto_swaps(model, lambda: model(step), scheme=scheme, structures=structures)
            arms[f"{scheme} {label}"] = {"plan": plan}
    for arm in arms.values():  # warm-up, and the arm's logits on the prompt
        handle = arm["plan"].attach(model) if arm["plan"] else None
        try:
            run_arm(model, prompt[:, :8], 4)
            with torch.no_grad():
                got = model(prompt[:, :16]).logits[0, -1]
            arm["logit_cosine"] = torch.nn.functional.cosine_similarity(got, want, dim=0).item()
            arm["seats"] = handle.summary()["seams"] if handle else 0
            arm["structures"] = sorted({r["structure"] for r in handle.report()}) if handle else []
        finally:
            if handle is not None:
                handle.detach()
    steps: dict[str, list[float]] = {k: [] for k in arms}
    items = list(arms.items())
    for r in range(rounds):
        for label, arm in items[r % len(items):] + items[:r % len(items)]:
            handle = arm["plan"].attach(model) if arm["plan"] else None
            try:
                steps[label].append(run_arm(model, prompt, NEW)["decode_step_s"])
            finally:
                if handle is not None:
                    handle.detach()
    host_step = statistics.median(steps["host"])
    rows = []
    print(f"\n{name}: {model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, "
          f"intermediate {model.config.intermediate_size}")
    print(f"{'arm':<28}{'seats':>6}{'step ms':>9}{'tok/s':>8}{'vs host':>9}{'vs proj':>9}"
          f"{'floor tok/s':>12}{'of floor':>9}{'logit cos':>11}")
    for label, arm in arms.items():
        stp = statistics.median(steps[label])
        nbytes = weight_bytes(model, arm["plan"].swaps if arm["plan"] else None)
        floor = bandwidth * 1e9 / nbytes
        scheme = label.split()[0]
        proj = f"{scheme} projections"
        vs_proj = statistics.median(steps[proj]) / stp if proj in steps else None
        row = {"arm": label, "seats": arm["seats"], "structures": arm["structures"],
               "decode_step_seconds": stp, "decode_tok_s": 1 / stp,
               "speedup_vs_host": host_step / stp, "speedup_vs_projection_seats": vs_proj,
               "weight_bytes_per_token": nbytes, "floor_tok_s": floor,
               "frac_of_floor": (1 / stp) / floor, "logit_cosine_vs_host": arm["logit_cosine"],
               "step_samples": steps[label]}
        rows.append(row)
        print(f"{label:<28}{arm['seats']:>6}{stp * 1e3:>9.2f}{1 / stp:>8.2f}"
              f"{host_step / stp:>8.2f}x{(f'{vs_proj:.3f}x' if vs_proj else '-'):>9}"
              f"{floor:>12.1f}{(1 / stp) / floor:>9.0%}{arm['logit_cosine']:>11.5f}")
    return {"host": name, "layers": model.config.num_hidden_layers,
            "hidden": model.config.hidden_size,
            "intermediate": model.config.intermediate_size, "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--phi-layers", type=int, default=8)
    parser.add_argument("--neox-layers", type=int, default=24)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    bandwidth = ops.read_bandwidth_gbps(1 << 30, repeats=5)
    m = machine()
    print(f"machine: {m['cpu']} ({m['tier']}), read bandwidth {bandwidth:.1f} GB/s, "
          f"kernels on {S.PARALLEL_BACKEND}")
    hosts = [bench_host("Phi (Phi-1.5 widths)", phi(args.phi_layers), args.rounds, bandwidth),
             bench_host("GPT-NeoX (Pythia-410M)", neox(args.neox_layers), args.rounds, bandwidth)]
    write_result(args.json, {"machine": m,
                             "read_bandwidth_gbps": bandwidth, "prompt": PROMPT, "new_tokens": NEW,
                             "rounds": args.rounds, "hosts": hosts})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

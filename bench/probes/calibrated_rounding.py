"""A torch prototype of calibrated symmetric int4 (g32) on SmolLM2, to compare roundings before
one goes into the core (Note [Calibrated rounding] in core/src/quant/calibrated.cpp).

Each decoder projection's weight is replaced by its rounding, dequantised (the head and
embedding stay fp32), and the model is scored by one causal forward: perplexity on the 2048
tokens bench/accuracy.py scores, on 6144 held-out tokens (10240..16384 of the text: neither
scored by the bench nor calibrated on), and the mean KL divergence to the host over all 8192.
Calibration: the input moments of each projection over the tokens after the scored ones
(2048..2048+N), in forwards of 512, as the bench hands them. A prototype, not the product: the
core's figures are bench/accuracy.py's.

    .venv/bin/python bench/probes/calibrated_rounding.py plain gptq gptq:keep=0.7 gptq:lazy=1
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import torch

from flashrt_structures import smollm2

G = 32  # the group
STEPS = (0.0, -1.0, -0.75, -0.5, -0.25, 0.25, 0.5, 0.75, 1.0)  # the core's grid search's


def grid_search(w: torch.Tensor, importance: torch.Tensor) -> torch.Tensor:
    """Per group of w [out, in], the symmetric grid's scale (levels -8..7) with the least
    importance-weighted squared error: the core's candidates, each refitted once."""
    out, n = w.shape
    wg = w.reshape(out, n // G, G)
    ig = importance.reshape(1, n // G, G).float()
    extreme = wg.gather(-1, wg.abs().argmax(-1, keepdim=True))[..., 0]
    best_err = torch.full(extreme.shape, math.inf)
    best = torch.zeros_like(extreme)

    def score(s: torch.Tensor) -> torch.Tensor:
        nonlocal best_err, best
        q = levels(wg, s[..., None])
        err = (ig * (wg - q * s[..., None]) ** 2).sum(-1)
        better = err < best_err
        best_err, best = torch.where(better, err, best_err), torch.where(better, s, best)
        return q

    for s in [-extreme / (8 + t) for t in STEPS] + [extreme.abs() / 7]:
        q = score(s)
        sqq, sqv = (ig * q * q).sum(-1), (ig * q * wg).sum(-1)
        score(torch.where(sqq > 0, sqv / sqq.clamp_min(1e-30), s))
    return best


def levels(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    inv = torch.where(s != 0, 1 / s, torch.zeros_like(s))
    return torch.clamp(torch.round(w * inv) + 8, 0, 15) - 8


def gptq(w: torch.Tensor, h: torch.Tensor, damp: float = 0.01, keep: float = 1.0,
         lazy: bool = False) -> torch.Tensor:
    """Act-order GPTQ: grids searched first (static groups; `lazy`: each when act-order reaches
    its group's first input, on the weights as the feedback moved them), inputs rounded by
    descending mean square with each error fed forward through U (H^-1 = U^T U). `keep`: what
    the solve keeps of the moments off their diagonal. Returns the dequantised weight."""
    w = w.clone().float()
    out, n = w.shape
    diag = torch.diag(h).clone()
    h = h * keep
    h[range(n), range(n)] = diag + damp * diag.mean()
    scales = grid_search(w, diag)
    order = torch.argsort(diag, descending=True, stable=True)
    pos = torch.argsort(order)
    hp = h[order][:, order]
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hp)), upper=True).float()
    wp, sp, q = w[:, order], scales[:, order // G], torch.zeros(out, n)
    seen = torch.zeros(n // G, dtype=torch.bool)
    block = 128
    for i0 in range(0, n, block):
        i1 = min(i0 + block, n)
        w1, e1 = wp[:, i0:i1].clone(), torch.zeros(out, i1 - i0)
        for j in range(i1 - i0):
            g = int(order[i0 + j]) // G
            if lazy and not seen[g]:
                seen[g] = True
                current = torch.empty(out, G)
                for t, m in enumerate(pos[g * G:(g + 1) * G].tolist()):  # none rounded yet
                    current[:, t] = (w1[:, m - i0] if m < i1
                                     else wp[:, m] - e1[:, :j] @ u[i0:i0 + j, m])
                scales[:, g] = grid_search(current, diag[g * G:(g + 1) * G])[:, 0]
                sp[:, order // G == g] = scales[:, g:g + 1]
            s = sp[:, i0 + j]
            q[:, i0 + j] = levels(w1[:, j], s)
            e = (w1[:, j] - q[:, i0 + j] * s) / u[i0 + j, i0 + j]
            w1[:, j:] -= e[:, None] * u[i0 + j, i0 + j:i1][None]
            e1[:, j] = e
        wp[:, i1:] -= e1 @ u[i0:i1, i1:]
    return q[:, pos] * scales.repeat_interleave(G, 1)


def main() -> None:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("arms", nargs="+", help="plain | gptq[:k=v,...] (damp, keep, lazy)")
    ap.add_argument("--calibration-tokens", type=int, default=2048)
    args = ap.parse_args()
    tok, model = smollm2.load()
    full = tok(smollm2.english_text(), return_tensors="pt").input_ids
    scored = full[:, :2048]
    held_out = [full[:, a:a + 2048] for a in range(10240, 16384, 2048)]
    cal = full[:, 2048:2048 + args.calibration_tokens]
    linears = {n: m for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and ".layers." in n}
    weights = {n: m.weight.data.clone() for n, m in linears.items()}
    reference: list[torch.Tensor] = []

    def evaluate() -> tuple[float, float, float]:
        nll, kl = [], []
        with torch.no_grad():
            for i, x in enumerate([scored, *held_out]):
                lp = torch.log_softmax(model(x).logits[0, :-1].double(), -1)
                nll.append(-lp.gather(1, x[0, 1:, None])[:, 0].mean().item())
                if len(reference) <= i:
                    reference.append(lp)
                kl.append((reference[i].exp() * (reference[i] - lp)).sum(-1).mean().item())
        return math.exp(nll[0]), math.exp(sum(nll[1:]) / len(held_out)), sum(kl) / len(kl)

    moments = {n: torch.zeros(m.in_features, m.in_features, dtype=torch.float64)
               for n, m in linears.items()}
    rows = dict.fromkeys(linears, 0)

    def hook(name: str):
        def record(_m: torch.nn.Module, inp: tuple, _out: torch.Tensor) -> None:
            x = inp[0].reshape(-1, inp[0].shape[-1]).double()
            moments[name] += x.T @ x
            rows[name] += x.shape[0]
        return record

    hooks = [m.register_forward_hook(hook(n)) for n, m in linears.items()]
    with torch.no_grad():
        for c in cal.split(512, dim=1):
            model(c)
    for h in hooks:
        h.remove()
    host = evaluate()
    print(f"host: ppl {host[0]:.4f}, held out {host[1]:.4f} "
          f"(calibration: tokens 2048..{2048 + cal.shape[1]})", flush=True)
    for arm in args.arms:
        name, _, opts = arm.partition(":")
        kw = {k: float(v) for k, v in (o.split("=") for o in opts.split(",") if o)}
        t0 = time.perf_counter()
        for n, m in linears.items():
            w, h = weights[n], moments[n] / rows[n]
            if name == "plain":
                s = grid_search(w, torch.ones(w.shape[1])).repeat_interleave(G, 1)
                m.weight.data = levels(w, s) * s
            else:
                m.weight.data = gptq(w, h, damp=kw.get("damp", 0.01), keep=kw.get("keep", 1.0),
                                     lazy=bool(kw.get("lazy", 0)))
        got = evaluate()
        print(f"{arm:<28} scored {100 * (got[0] / host[0] - 1):+.2f}%  held out "
              f"{100 * (got[1] / host[1] - 1):+.2f}%  KL {got[2]:.4f}  "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
        for n, m in linears.items():
            m.weight.data = weights[n].clone()


if __name__ == "__main__":
    main()

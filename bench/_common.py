"""What every benchmark shares: the machine it ran on, the read bandwidth a figure is held
against, and writing its JSON result."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import flashrt_structures as S
from flashrt_structures import ops
from flashrt_structures.envlock import cpu_model

# Note [Bracketed bandwidth]: this guest's read bandwidth is not one number. Its two vCPUs
# together usually stream ~35 GB/s (one alone ~33), and for seconds at a time ~65; a probe taken
# a minute before a figure, or the best of a run, says little about the bandwidth the figure had.
# So a rate is measured between two probes, the one just before and the one just after, and held
# against their mean; a result is the median of many such brackets, each short (a probe reads
# 256 MiB, ~8 ms; an arm runs ~50 ms). Brackets whose two probes disagree by more than 20% (the
# bandwidth moved during the arm) are kept in the JSON but left out of the median.
PROBE_BYTES = 1 << 28
STEADY = 0.2


def probe(threads: int = 2) -> float:
    return ops.read_bandwidth_gbps(PROBE_BYTES, threads=threads, repeats=1)


@dataclass
class Bracket:
    gbps: float    # the arm's rate (its bytes over its seconds)
    before: float  # read bandwidth just before and just after it, GB/s
    after: float

    @property
    def bandwidth(self) -> float:
        return (self.before + self.after) / 2

    @property
    def fraction(self) -> float:
        return self.gbps / self.bandwidth

    @property
    def steady(self) -> bool:
        return abs(self.before - self.after) <= STEADY * self.bandwidth


def bracket(run: Callable[[], float], nbytes: float, threads: int = 2) -> Bracket:
    """run() does the work and returns its seconds; nbytes is what it must read."""
    before = probe(threads)
    secs = run()
    after = probe(threads)
    return Bracket(nbytes / secs / 1e9, before, after)


def timed(fn: Callable[[], object], seconds: float = 0.05) -> Callable[[], float]:
    """A run() for bracket(): fn repeated for about `seconds`, returning seconds per call."""
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-6)
    calls = max(1, int(seconds / once))

    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls
    return run


def summarize(brackets: list[Bracket]) -> dict[str, Any]:
    """The median fraction of the bracketing bandwidth over the steady brackets, its quartiles,
    and the median rate and bandwidth, with every bracket kept."""
    steady = [b for b in brackets if b.steady] or brackets
    fr = sorted(b.fraction for b in steady)
    q = statistics.quantiles(fr, n=4) if len(fr) >= 2 else [fr[0]] * 3
    return {"frac_of_bandwidth": statistics.median(fr), "frac_quartiles": [q[0], q[2]],
            "gbps": statistics.median(b.gbps for b in steady),
            "bandwidth_gbps": statistics.median(b.bandwidth for b in steady),
            "brackets": len(brackets), "steady_brackets": len(steady),
            "samples": [[b.gbps, b.before, b.after] for b in brackets]}



def cpu_family_model() -> str:
    """"family F model M" from /proc/cpuinfo: the part when a hypervisor blanks the model name
    (family 25 model 1 is Zen 3 Milan, model 17 Zen 4 Genoa, whose AVX-512 a guest may not see)."""
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("cpu family", "model") and key.strip() not in fields:
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return f"family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"


def cpu_flags_tier() -> str:
    """The best tier /proc/cpuinfo's flags reach, whatever FRT_CPU_CAP says (the tier a result
    ran at may be capped below it, to read two tiers side by side on one machine)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_tile", "amx_int8"} <= flags:
        return "amx"
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags:
        return "avx512vnni"
    return "avx2" if {"avx2", "fma", "f16c"} <= flags else "generic"


def last_level_cache_bytes() -> int:
    """The largest data or unified cache cpu0 reports (sysfs), 0 where it reports none. A guest
    may report its host's: an Intel Xeon guest here says 480 MiB of L3."""
    largest = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        number = size.rstrip("KMG")
        if number.isdigit():
            largest = max(largest, int(number) * units.get(size[-1], 1))
    return largest


def transparent_huge_pages() -> str:
    """The system's THP mode ("always", "madvise" or "never"): packed weights are advised into
    huge pages, which only "madvise" and "always" grant (Note [Weights in huge pages])."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "unknown"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else text.strip()


def thp_fallbacks() -> int:
    """The system's count of huge-page faults that fell back to small pages (thp_fault_fallback
    in /proc/vmstat; 0 where absent): its growth while packing says some packs lie in 4 KiB
    pages."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("thp_fault_fallback "):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def current_tier() -> str:
    return S._core.cpu().tier


def result_path(given: Path | None, name: str) -> Path:
    """Where a result goes: the --json path when given, else bench/results/<tier>/<name>.json,
    so the same benchmark run at two tiers lands side by side."""
    if given is not None:
        return given
    return Path(__file__).resolve().parent / "results" / current_tier() / f"{name}.json"


def machine() -> dict[str, Any]:
    """The machine a result came from: CPU model, the ISA tier the kernel path loads (and the
    one the CPU reaches, when FRT_CPU_CAP holds it below), threads."""
    cpu = S._core.cpu()
    return {"cpu": cpu_model(), "cpu_id": cpu_family_model(), "tier": cpu.tier,
            "cpu_flags_tier": cpu_flags_tier(), "tier_cap": os.environ.get("FRT_CPU_CAP"),
            "transparent_huge_pages": transparent_huge_pages(),
            "huge_pages_env": os.environ.get("FRT_HUGE_PAGES"),
            "cores": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "parallel": S.PARALLEL_BACKEND}


def write_result(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


def llama_logits(llm) -> torch.Tensor:
    """The last evaluated position's logits (llama-cpp-python keeps no scores without
    logits_all), as a view of llama.cpp's buffer."""
    import numpy as np

    return torch.from_numpy(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)))


def engine_rows(arms: dict[str, Any], reference: str, select: Callable[[Any], Any],
                run: Callable[[int, int, int, int], tuple[float, list]], concurrency: list[int],
                rounds: int, prompt: int, new_tokens: int, label: str) -> list[dict[str, Any]]:
    """A serving engine's arms at each concurrency, paired in one engine: per round every arm
    (`select(arms[arm])`) runs `run(prompt, new_tokens, c, seed) -> (tok/s, tokens)` and once
    with one new token (its prefill: the decode rate is the rest), the first arm rotating per
    round. Per arm: the median tok/s, prefill and decode rates, the median per-round ratio to
    `reference` and the first 16 tokens' agreement with it. Prints two lines per concurrency."""
    rows = []
    for c in concurrency:
        per: dict[str, list[float]] = {a: [] for a in arms}
        pre: dict[str, list[float]] = {a: [] for a in arms}
        dec: dict[str, list[float]] = {a: [] for a in arms}
        same: dict[str, list[float]] = {a: [] for a in arms}
        for rnd in range(rounds):
            order = list(arms)[rnd % len(arms):] + list(arms)[:rnd % len(arms)]
            toks = {}
            for arm in order:
                select(arms[arm])
                tps, toks[arm] = run(prompt, new_tokens, c, 100 + rnd)
                per[arm].append(tps)
                one, _ = run(prompt, 1, c, 100 + rnd)
                prefill_s, total_s = c / one, c * new_tokens / tps
                pre[arm].append(c * prompt / prefill_s)
                dec[arm].append(c * (new_tokens - 1) / max(total_s - prefill_s, 1e-9))
            for arm in arms:
                agree = [sum(a == b for a, b in zip(x[:16], y[:16])) / 16
                         for x, y in zip(toks[arm], toks[reference])]
                same[arm].append(statistics.mean(agree))
        row: dict[str, Any] = {"concurrency": c, "rounds": rounds}
        for arm in arms:
            row[f"{arm}_tok_s"] = statistics.median(per[arm])
            row[f"{arm}_runs"] = per[arm]
            row[f"{arm}_prefill_tok_s"] = statistics.median(pre[arm])
            row[f"{arm}_decode_tok_s"] = statistics.median(dec[arm])
            if arm != reference:
                row[f"{arm}_vs_{reference}"] = statistics.median(
                    a / b for a, b in zip(per[arm], per[reference]))
                row[f"{arm}_first16_agreement"] = statistics.mean(same[arm])
        rows.append(row)
        print(f"  {label} c={c:>2}: {reference} {row[reference + '_tok_s']:7.2f}" + "".join(
            f"  {a} {row[a + '_tok_s']:7.2f} ({row[f'{a}_vs_{reference}']:.2f}x)"
            for a in arms if a != reference) + " tok/s", flush=True)
        print(f"  {label} c={c:>2} prefill / decode tok/s: " + "  ".join(
            f"{a} {row[a + '_prefill_tok_s']:.0f} / {row[a + '_decode_tok_s']:.2f}"
            for a in arms), flush=True)
    return rows


# Qwen3-0.6B's config sizes: the serving-engine benchmarks' model (random weights).
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                 num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=128, max_position_embeddings=4096, tie_word_embeddings=True)


def qwen3_06b_checkpoint(layers: int, directory: Path) -> Path:
    """A Qwen3-0.6B-shaped checkpoint of `layers` layers, random weights, fp32."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(**{**QWEN3_06B, "num_hidden_layers": layers})
    torch.manual_seed(0)
    with torch.device("cpu"):
        Qwen3ForCausalLM(cfg).float().save_pretrained(directory)
    return directory


def qwen3_06b_weight_bytes(layers: int, elem: int) -> int:
    """What one decode step reads of that host's projection and head weights."""
    c = QWEN3_06B
    d, f, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    per_layer = d * (q + 2 * kv) + q * d + d * 2 * f + f * d
    return (layers * per_layer + c["vocab_size"] * d) * elem

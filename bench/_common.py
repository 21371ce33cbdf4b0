"""What every benchmark shares: the machine it ran on, and writing its JSON result."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

import flashrt_structures as S


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


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
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags:
        return "avx512vnni"
    return "avx2" if {"avx2", "fma", "f16c"} <= flags else "generic"


def transparent_huge_pages() -> str:
    """The system's THP mode ("always", "madvise" or "never"): packed weights are advised into
    huge pages, which only "madvise" and "always" grant (Note [Weights in huge pages])."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "unknown"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else text.strip()


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

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


def machine() -> dict[str, Any]:
    """The machine a result came from: CPU model, the ISA tier the kernel path loads, threads."""
    cpu = S._core.cpu()
    return {"cpu": cpu_model(), "cpu_id": cpu_family_model(), "tier": cpu.tier,
            "cores": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "parallel": S.PARALLEL_BACKEND}


def write_result(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")

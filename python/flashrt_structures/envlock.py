"""The environment lock of a receipt: what a result depends on besides the host and the plan.

Library versions, the CPU (model name, the ISA tier the kernel path loads) and each kernel
package's version, chosen variant and library digest (the sha256 the hub checked the file against
before loading it). `drift(saved)` lists, readably, what differs on this machine now. Python
observes here; nothing is chosen from it.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from . import _core, impls

DIST = "flashrt-structures"
# Always recorded (None when not installed): what every door's result depends on.
LIBRARIES: tuple[str, ...] = ("torch", "transformers")
# Recorded when the process has imported them: the hosts of the diffusers and vLLM doors.
OPTIONAL_LIBRARIES: tuple[str, ...] = ("diffusers", "vllm")


def library_version(name: str) -> str | None:
    """The installed distribution's version (what pip reports), None when not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None)
        return str(version) if version is not None else None


def cpu_model() -> str:
    """The CPU's model name as the OS reports it (a hypervisor may blank it)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _kernel(repo: str) -> dict[str, Any]:
    r = impls.resolve(repo)
    chosen = next((v for v in r.variants if v.chosen), None)
    entry: dict[str, Any] = {"repo": repo, "version": r.version, "revision": r.revision,
                             "source": r.source, "variant": r.chosen or None,
                             "isa": chosen.isa if chosen else None,
                             "sha256": chosen.sha256 if chosen else None}
    if chosen is None:
        why = [e for e in _core.unavailable_report() if e.repo == repo]
        # The last row is why nothing loaded (a withheld better build is reported before it).
        entry["unavailable"] = (f"{why[-1].error}: {why[-1].detail}" if why
                                else "no variant loaded")
    return entry


def capture() -> dict[str, Any]:
    """This process's environment lock (receipts.md, `environment`)."""
    cpu = _core.cpu()
    libraries = {name: library_version(name) for name in LIBRARIES}
    libraries.update({name: library_version(name) for name in OPTIONAL_LIBRARIES
                      if name in sys.modules})
    repos = sorted(set(impls.KNOWN_PACKAGES) | set(_core.visible_packages()))
    return {
        "flashrt": library_version(DIST),
        "python": platform.python_version(),
        "libraries": libraries,
        "cpu": {"model": cpu_model(), "arch": cpu.arch, "os": cpu.os, "tier": cpu.tier,
                "tier_cap": os.environ.get("FRT_CPU_CAP"), "features": sorted(cpu.features)},
        "threads": _core.num_threads(),
        "kernels": [_kernel(repo) for repo in repos],
    }


def _changed(what: str, was: Any, now: Any) -> str:
    return f"{what} {was if was is not None else 'not installed'} -> " \
           f"{now if now is not None else 'not installed'}"


def drift(saved: dict[str, Any], now: dict[str, Any] | None = None) -> list[str]:
    """What differs between a saved lock (already validated) and this machine now; [] when
    nothing does. Compared: flashrt, Python and each recorded library's version; the CPU's
    architecture, model name and tier; per recorded kernel package its version, revision, chosen
    variant and library digest (or that it no longer loads here)."""
    now = now or capture()
    out: list[str] = []
    for key, label in (("flashrt", "flashrt"), ("python", "Python")):
        if saved[key] != now[key]:
            out.append(_changed(label, saved[key], now[key]))
    for name, was in saved["libraries"].items():
        current = now["libraries"].get(name, library_version(name))
        if was != current:
            out.append(_changed(name, was, current))
    for key, label in (("arch", "CPU architecture"), ("model", "CPU model"), ("tier", "CPU tier")):
        if saved["cpu"][key] != now["cpu"][key]:
            out.append(f"{label} {saved['cpu'][key]} -> {now['cpu'][key]}")
    here = {k["repo"]: k for k in now["kernels"]}
    for was in saved["kernels"]:
        repo = was["repo"]
        cur = here.get(repo) or _kernel(repo)
        if was["variant"] is not None and cur["variant"] is None:
            out.append(f"{repo} does not load here ({cur.get('unavailable', 'unavailable')})")
            continue
        for key, label in (("version", "version"), ("revision", "revision"),
                           ("variant", "variant")):
            if was[key] != cur[key]:
                out.append(f"{repo} {label} {was[key]} -> {cur[key]}")
        if was["variant"] == cur["variant"] and was["sha256"] != cur["sha256"]:
            out.append(f"{repo} library digest changed ({_short(was['sha256'])} -> "
                       f"{_short(cur['sha256'])})")
    return out


def _short(digest: str | None) -> str:
    return digest[:12] if digest else "none"

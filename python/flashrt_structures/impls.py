"""Kernel availability: which kernel packages this machine can use, and why not where not."""

from __future__ import annotations

from typing import Any

from . import _core

# The packages this install's impls use.
KNOWN_PACKAGES: tuple[str, ...] = ("flashrt/linear", "flashrt/ffn", "flashrt/decode",
                                   "flashrt/gemm", "flashrt/recurrent")


def resolve(repo: str) -> _core.PackageResolution:
    """Resolves one package on the kernel path (cached); failures land in unavailable_report()."""
    return _core.resolve(repo)


def unavailable_report() -> list[dict[str, str]]:
    """Every package that could not be used: {repo, version, error, detail}, kept verbatim."""
    return [
        {"repo": e.repo, "version": e.version, "error": e.error, "detail": e.detail}
        for e in _core.unavailable_report()
    ]


def clear_unavailable_report() -> None:
    """Forgets failures and cached resolutions, so the next resolve() tries again."""
    _core.clear_unavailable_report()


def kernels_report() -> dict[str, Any]:
    """Packages on the path, their variants, the variant chosen and every unavailable entry."""
    cpu = _core.cpu()
    repos = sorted(set(KNOWN_PACKAGES) | set(_core.visible_packages()))
    packages = []
    for repo in repos:
        r = resolve(repo)
        packages.append(
            {
                "repo": r.repo,
                "version": r.version,
                "revision": r.revision,
                "source": r.source,
                "dir": r.dir,
                "chosen": r.chosen,
                "variants": [
                    {"name": v.name, "isa": v.isa, "chosen": v.chosen, "reason": v.reason}
                    for v in r.variants
                ],
            }
        )
    return {
        "cpu": {"arch": cpu.arch, "os": cpu.os, "tier": cpu.tier, "features": sorted(cpu.features)},
        "threads": _core.num_threads(),
        "packages": packages,
        "unavailable": unavailable_report(),
    }

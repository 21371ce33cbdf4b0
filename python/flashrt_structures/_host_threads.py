"""Runs flashrt's kernel threads on torch's own OpenMP team.

Two thread teams on a small machine fight: torch's idle OpenMP threads spin after each operator,
so a second team started right after one waits for a scheduler time slice. The core therefore
runs its phases as parallel regions of torch's runtime when torch uses OpenMP (Note [One team
per process] in core/src/runtime/thread_pool.cpp); otherwise it keeps its own pool.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from . import _core


def _torch_libgomp() -> Path | None:
    libdir = Path(torch.__file__).resolve().parent / "lib"
    candidates = sorted(libdir.glob("libgomp*.so*"))
    return candidates[0] if candidates else None


def install() -> str:
    """Hands the core torch's OpenMP entry points; returns the backend now in use.

    FRT_THREADS=own keeps the core's own pool (for measuring the difference).
    """
    if os.environ.get("FRT_THREADS", "") == "own":
        _core.use_own_threads()
        return _core.parallel_backend()
    if "OpenMP" not in torch.__config__.parallel_info():
        return _core.parallel_backend()
    path = _torch_libgomp()
    if path is None:
        return _core.parallel_backend()
    lib = ctypes.CDLL(str(path))  # already loaded by torch: the same handle, no second runtime
    try:
        addr = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                for name in ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads",
                             "omp_get_max_threads")]
    except AttributeError:
        return _core.parallel_backend()
    gomp_parallel, thread_num, num_threads, max_threads = addr
    if gomp_parallel is None or thread_num is None or num_threads is None or max_threads is None:
        return _core.parallel_backend()  # a null entry point: keep the core's own pool
    _core.use_host_openmp(gomp_parallel, thread_num, num_threads, max_threads, str(path))
    return _core.parallel_backend()

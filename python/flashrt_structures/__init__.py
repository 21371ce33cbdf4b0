"""flashrt_structures: the Python door over the flashrt C++ core.

The core (kernel path, packers, kernel ops) lives in the compiled extension ``_core``; this
package points the core at the kernel packages bundled with the install and re-exports what a
user calls.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import _core

_core.use_dlpack_exchange(torch.Tensor)  # fast, copy-free tensor views when torch offers them
BUNDLED_KERNELS = Path(__file__).resolve().parent / "kernels"
_core.set_bundled_root(str(BUNDLED_KERNELS))

from . import _host_threads, impls, ops, swap  # noqa: E402  (after the bundled root is set)
from ._core import KernelUnavailable, Refused  # noqa: E402
from .adopt import AdoptionReport, adopt_prequantized  # noqa: E402
from .autoswap import AutoPlan, auto_swaps, explain, list_schemes  # noqa: E402
from .catalog import list_structures, load  # noqa: E402
from .decode import DecodeLoop, decode_loop  # noqa: E402
from .frontdoor import FrontDoorResult, attach  # noqa: E402
from .receipt import check_receipt  # noqa: E402
from .seats import GuardRefused  # noqa: E402
from .structures import GateRefused, get  # noqa: E402
from .swap import attached  # noqa: E402

PARALLEL_BACKEND = _host_threads.install()

__all__ = [
    "BUNDLED_KERNELS", "PARALLEL_BACKEND", "AdoptionReport", "AutoPlan", "adopt_prequantized",
    "DecodeLoop", "decode_loop", "FrontDoorResult", "GateRefused",
    "check_receipt",
    "GuardRefused", "KernelUnavailable", "Refused", "attach", "attached", "auto_swaps", "explain",
    "get", "impls", "list_schemes", "list_structures", "load", "ops", "swap",
]

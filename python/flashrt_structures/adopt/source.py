"""What every reader hands adoption: one checkpoint tensor as a module's weight."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import _core


@dataclass
class Source:
    """One checkpoint tensor as a module's weight, or as one operand of a module's bank of
    experts: its form and its unpacked parts."""

    module: str
    tensor_name: str
    block_type: str
    form: _core.WeightForm | None = None
    pack: Any = None  # _core.PackedLinear
    refusal: str = ""
    # The relative rounding of the source's own dequantisation (compressed-tensors computes
    # (q - zp) * s in the scale's dtype): what the host's copy of d*q may differ by.
    rounding: float = float(np.finfo(np.float32).eps)
    # A bank operand ("gate", "up", "down"; "" for a module's weight): the host tensor it fills
    # (its [experts, out, in] tensor, or the part'th of `parts` equal slices of a fused one's
    # second dimension) and one pack per expert, in expert order.
    operand: str = ""
    tensor: str = "weight"
    part: int = 0
    parts: int = 1
    packs: list[Any] = field(default_factory=list)

    @property
    def key(self) -> str:
        """Its key for the plan (PlanOptions.source_forms): the module, or "<module>/<operand>"
        for a bank operand."""
        return f"{self.module}/{self.operand}" if self.operand else self.module


def weight_form(name: str, tag: str, fmt: Any, group: int, symmetric: bool,
                f16: bool) -> _core.WeightForm:
    """A checkpoint's own form, named for the plan (the catalog's forms are the schemes')."""
    f = _core.WeightForm()
    f.name, f.tag, f.format, f.group, f.symmetric = name, tag, fmt, group, symmetric
    f.scale_dtype = _core.DType.f16 if f16 else _core.DType.f32
    return f

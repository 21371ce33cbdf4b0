"""Adoption: seat a quantised checkpoint's own blocks instead of requantising the host.

* `adoption`: `adopt_prequantized` (conversion check, plan, seats, attach) and its report;
* `gguf`, `compressed_tensors`: one reader per format, each giving per module a `Source` (the
  form and pack, or why no kernel reads it);
* `source`: what a reader hands adoption.
"""

from __future__ import annotations

from .adoption import FORMATS, AdoptionReport, adopt_prequantized

__all__ = ["FORMATS", "AdoptionReport", "adopt_prequantized"]

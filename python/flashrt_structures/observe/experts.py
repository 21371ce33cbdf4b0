"""Banks of routed experts: recognising the module that holds them, and measuring its gated form
on its own calls.

A bank is a module holding 3-D expert tensors: transformers' experts modules keep `gate_up_proj`
[experts, 2F, D] (or `gate_proj` and `up_proj`) and `down_proj` [experts, D, F], declared by its
experts interface (`has_gate`, `is_transposed`, `is_concatenated`, `has_bias`). Its call is
(hidden [rows, D], top_k_index [rows, k], top_k_weights [rows, k]). What the gated form computes is
measured, never read from the class: the module's observed output is compared with
sum_j w[r, j] * down_e(act(gate_e x) * up_e x) for each activation the kernels compute.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import _core

# Rows of an observed call the measurement recomputes: enough to tell the activations apart.
_MEASURED_ROWS = 4
_GATED_ACTIVATIONS = {
    _core.Activation.silu: torch.nn.functional.silu,
    _core.Activation.gelu_tanh: lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
}


def _bank(mod: nn.Module, name: str) -> torch.Tensor | None:
    t = mod._parameters.get(name)
    return t if isinstance(t, torch.Tensor) and t.dim() == 3 else None


def describe_bank(mod: nn.Module) -> _core.ExpertFacts | None:
    """The bank's facts when `mod` holds 3-D expert tensors (a down bank and a gate/up bank or
    an up bank), else None."""
    down = _bank(mod, "down_proj")
    gate_up, gate, up = _bank(mod, "gate_up_proj"), _bank(mod, "gate_proj"), _bank(mod, "up_proj")
    if down is None or (gate_up is None and up is None):
        return None
    first = gate_up if gate_up is not None else up
    assert first is not None
    e, a, b = down.shape
    c, d = first.shape[1] // (2 if gate_up is not None else 1), first.shape[2]
    transposed_c, transposed_d = first.shape[1], first.shape[2] // (2 if gate_up is not None else 1)
    facts = _core.ExpertFacts()
    facts.experts = e
    # The layout from the shapes (the experts interface's is_transposed says the same where it
    # is declared): [E, out, in] banks chain as gate/up [E, F, D] and down [E, D, F]; [E, in, out]
    # ones as gate/up [E, D, F] and down [E, F, D]. Banks that chain neither way are no bank.
    if first.shape[0] == e and c == b and d == a:
        facts.hidden, facts.intermediate = a, b
    elif first.shape[0] == e and transposed_c == b and transposed_d == a:
        facts.hidden, facts.intermediate, facts.transposed = b, a, True
    else:
        return None
    facts.transposed = facts.transposed or bool(getattr(mod, "is_transposed", False))
    # An interleaved gate_up ([gate0, up0, gate1, ...]) is no pair of halves: a layout the bank
    # op does not read, refused as such by the boundary.
    if gate_up is not None and not bool(getattr(mod, "is_concatenated", True)):
        facts.transposed = True
    facts.has_bias = bool(getattr(mod, "has_bias", False)) or any(
        n.endswith("_bias") and isinstance(p, torch.Tensor)
        for n, p in mod._parameters.items())
    facts.down = "down_proj"
    if gate_up is not None:
        facts.gate_up = "gate_up_proj"
    elif gate is not None and up is not None:
        facts.gate, facts.up = "gate_proj", "up_proj"
    else:
        facts.up = "up_proj"  # ungated: refused by the boundary
    return facts


def find_router(parent: nn.Module, parent_path: str, bank_name: str,
                facts: _core.ExpertFacts) -> str:
    """The sibling holding the routing weight [experts, hidden] (what picks the bank's experts),
    or "" when none does."""
    for name, child in parent.named_children():
        w = child._parameters.get("weight")
        if name != bank_name and isinstance(w, torch.Tensor) and tuple(w.shape) == (
                facts.experts, facts.hidden):
            return f"{parent_path}.{name}" if parent_path else name
    return ""


def _expected(mod: nn.Module, facts: _core.ExpertFacts, x: torch.Tensor, index: torch.Tensor,
              weights: torch.Tensor, act: Any) -> torch.Tensor:
    """The reference for the first rows: sum_j w * down_e(act(gate_e x) * up_e x), in fp32."""
    down = getattr(mod, facts.down).detach().float()
    f = facts.intermediate
    out = torch.zeros(x.shape[0], facts.hidden)
    for r in range(x.shape[0]):
        for j in range(index.shape[1]):
            e = int(index[r, j])
            if facts.gate_up:
                gu = getattr(mod, facts.gate_up)[e].detach().float()
                g, u = gu[:f], gu[f:]
            else:
                g = getattr(mod, facts.gate)[e].detach().float()
                u = getattr(mod, facts.up)[e].detach().float()
            xr = x[r].float()
            h = act(g @ xr) * (u @ xr)
            out[r] += float(weights[r, j]) * (down[e] @ h)
    return out


def measure_bank(mod: nn.Module, facts: _core.ExpertFacts, args: tuple[Any, ...],
                 output: Any) -> _core.Activation | None:
    """What one observed call of the bank computes: the activation whose gated form reproduces
    its output on the call's first rows; Activation.unknown when none does; None when the call
    is not (hidden, top_k_index, top_k_weights) -> tensor or the layout is not read here."""
    if (len(args) < 3 or not all(isinstance(a, torch.Tensor) for a in args[:3])
            or not isinstance(output, torch.Tensor) or facts.transposed):
        return None
    x, index, weights = args[0], args[1], args[2]
    if (x.dim() != 2 or index.dim() != 2 or weights.shape != index.shape
            or index.dtype not in (torch.int64, torch.int32) or x.shape[-1] != facts.hidden):
        return None
    if not facts.gate_up and not (facts.gate and facts.up):
        return _core.Activation.unknown
    rows = min(_MEASURED_ROWS, x.shape[0])
    if rows == 0 or bool((index[:rows] < 0).any()) or bool((index[:rows] >= facts.experts).any()):
        return None
    got = output[:rows].detach().float()
    scale = float(got.abs().max()) or 1.0
    tol = 2e-2 if x.dtype != torch.float32 else 1e-4
    with torch.no_grad():
        for act, fn in _GATED_ACTIVATIONS.items():
            want = _expected(mod, facts, x[:rows], index[:rows], weights[:rows], fn)
            if float((want - got).abs().max()) <= tol * scale:
                return act
    return _core.Activation.unknown

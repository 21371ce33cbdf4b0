"""Observation: turns `model, forward` into the core's neutral HostGraph.

What is recorded is structural: module kinds, slot tensors (shape, dtype, identity), what an
activation module computes (measured, not read from its class), and what one real forward showed
(rows per call, dtypes, which calls shared a tensor, call order). Nothing is matched on type or
model names; the planner in the core does the matching.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
from torch import nn

from . import _core

Forward = Callable[[], object]

_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
           torch.float64: "f64"}


def dtype_name(dt: torch.dtype) -> str:
    return _DTYPES.get(dt, str(dt).replace("torch.", ""))


def normalise_forwards(forward: Forward | Iterable[Forward]) -> list[Forward]:
    """One zero-argument callable, or a list of them (one per sample)."""
    if callable(forward):
        return [forward]
    thunks = list(forward)
    if not thunks or not all(callable(f) for f in thunks):
        raise ValueError("forward must be a zero-argument callable or a non-empty list of them")
    return thunks


_PROBE = torch.linspace(-6.0, 6.0, 121)
_REFERENCE_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": torch.nn.functional.silu,
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
    "gelu": torch.nn.functional.gelu,
    "relu": torch.relu,
}


def measure_activation(module: nn.Module) -> str | None:
    """What a parameter-free leaf module computes elementwise, by evaluating it; None when it is
    not an elementwise nonlinearity (it fails on a probe, changes the shape, or is the identity)."""
    if any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.children()):
        return None
    try:
        with torch.no_grad():
            y = module(_PROBE.clone())
    except Exception:  # noqa: BLE001 - a module that cannot take a probe is simply not one
        return None
    if not isinstance(y, torch.Tensor) or y.shape != _PROBE.shape or y.dtype != _PROBE.dtype:
        return None
    if torch.equal(y, _PROBE):
        return None
    for name, fn in _REFERENCE_ACTIVATIONS.items():
        if torch.allclose(y, fn(_PROBE), atol=1e-5, rtol=1e-5):
            return name
    return "unknown"


def _path_of(model: nn.Module, target: nn.Module | None) -> str:
    if target is None:
        return ""
    for name, mod in model.named_modules():
        if mod is target:
            return name
    return ""


def _rows(t: torch.Tensor) -> int:
    return math.prod(t.shape[:-1]) if t.dim() >= 1 else 1


def observe(model: nn.Module, forwards: list[Forward]) -> _core.HostGraph:
    graph = _core.HostGraph()
    modules = []
    hooked: list[tuple[str, nn.Module]] = []
    for path, mod in model.named_modules():
        hm = _core.HostModule()
        hm.path = path
        hm.type_name = type(mod).__name__
        hm.children = [f"{path}.{n}" if path else n for n, _ in mod.named_children()]
        if isinstance(mod, nn.Linear):
            hm.kind = "linear"
            hm.in_features, hm.out_features = mod.in_features, mod.out_features
            hm.has_bias = mod.bias is not None
            hm.weight_dtype = dtype_name(mod.weight.dtype)
            hm.weight_device = mod.weight.device.type
            hm.weight_id = mod.weight.data_ptr()
            hooked.append((path, mod))
        elif isinstance(mod, nn.Embedding):
            hm.kind = "embedding"
            hm.in_features, hm.out_features = mod.num_embeddings, mod.embedding_dim
            hm.weight_dtype = dtype_name(mod.weight.dtype)
            hm.weight_id = mod.weight.data_ptr()
        elif (act := measure_activation(mod)) is not None:
            hm.kind = "activation"
            hm.activation = act
            hooked.append((path, mod))
        else:
            hm.kind = "module"
        modules.append(hm)
    graph.modules = modules

    get_out = getattr(model, "get_output_embeddings", None)
    get_in = getattr(model, "get_input_embeddings", None)
    graph.output_head = _path_of(model, get_out()) if callable(get_out) else ""
    graph.input_embedding = _path_of(model, get_in()) if callable(get_in) else ""

    calls: list[_core.HostCall] = []
    keep: list[torch.Tensor] = []  # holds every observed tensor so no id is reused meanwhile

    def hook_for(path: str):
        def hook(_mod, args, output):
            if not args or not isinstance(args[0], torch.Tensor) or not isinstance(output, torch.Tensor):
                return
            x = args[0]
            c = _core.HostCall()
            c.path = path
            c.rows = _rows(x)
            c.width = x.shape[-1] if x.dim() else 1
            c.dtype = dtype_name(x.dtype)
            c.input_id, c.output_id = id(x), id(output)
            keep.extend((x, output))
            calls.append(c)
        return hook

    handles = [mod.register_forward_hook(hook_for(path)) for path, mod in hooked]
    try:
        with torch.no_grad():
            for fwd in forwards:
                fwd()
    finally:
        keep.clear()
        for h in handles:
            h.remove()
    graph.calls = calls
    return graph

"""Reading the engine's model in the hook's window (Note [The window on CPU]): what refuses the
whole engine, the sites a refusal names, the tree described and the weights held before the
engine repacks them (projections, the head and the fused expert banks, `banks`), and the observed
forward after."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from .. import _core, observe
from ..engine_door import head_module, no_norms
from . import banks
from .adapters import HEAD_ATTR, HeadMethod


def whole_engine_refusal(model: nn.Module, model_config: Any) -> str:
    """Why no seat may stand in this engine at all, or ""."""
    try:
        from vllm.distributed import get_tensor_model_parallel_world_size
        tp = get_tensor_model_parallel_world_size()
    except Exception:  # noqa: BLE001 - no parallel state: a single process
        tp = 1
    if tp > 1:
        return (f"tensor parallel size {tp}: each process holds a shard of every projection and "
                "vLLM reduces across processes; the seats take whole projections (tp = 1)")
    quant = getattr(model_config, "quantization", None)
    if quant:
        return (f"quantized checkpoint ({quant}): its projections hold weights in the checkpoint's "
                "own form; adopting them (adopt_prequantized) is not built")
    return ""


def _looks_up(method: Any) -> bool:
    """Whether a layer's method implements token lookups (vLLM's base method only declares it)."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
    return type(method).embedding is not QuantizeMethodBase.embedding


def head(model: nn.Module) -> nn.Module | None:
    """The engine's head layer, when it is a projection."""
    layer = getattr(model, HEAD_ATTR, None)
    return layer if isinstance(layer, nn.Module) and observe.engine_projection(layer) else None


def sites(model: nn.Module) -> list[str]:
    """The sites a whole-engine refusal names, read before the engine repacks the weights: layers
    whose method applies a 2-D weight, in whatever form (one whose method implements lookups is
    the embedding), the fused expert banks, and the head."""
    out = [p for p, m in model.named_modules()
           if callable(getattr(getattr(m, "quant_method", None), "apply", None))
           and not _looks_up(m.quant_method)
           and (banks.engine_bank(m)
                or any(t is not None and t.dim() == 2 for t in m._parameters.values()))]
    return out + ([HEAD_ATTR] if head(model) is not None else [])


def whole_engine_refusals(model: nn.Module, why: str) -> list[tuple[str, str]]:
    """Each site refused with the whole engine's reason; a bank that expert parallelism splits
    is named with that reason instead (its own, whatever the projections' is)."""
    out = []
    for path in sites(model):
        mod = model.get_submodule(path) if path != HEAD_ATTR else None
        own = banks.expert_parallel(mod) if mod is not None and banks.engine_bank(mod) else ""
        out.append((path, own or why))
    return out


def describe(model: nn.Module) -> tuple[_core.HostGraph, list, dict[str, dict[str, torch.Tensor]]]:
    """Before the engine takes the weights: the tree, the modules to observe, and each
    projection's and seatable bank's tensors held by reference (a bank is described as a bank
    of experts: Note [The bank in the window])."""
    graph, hooked = observe.describe_tree(model)
    no_norms(graph)
    held: dict[str, dict[str, torch.Tensor]] = {}
    for path, mod in model.named_modules():
        if observe.engine_projection(mod):
            held[path] = {n: t.detach() for n, t in mod._parameters.items() if t is not None}
    described = {}
    for path, mod in banks.banks(model):
        # A bank the door refuses is described too, never measured (its activation stays
        # unknown: the plan refuses it; undescribed() names the door's reason), so its router
        # is still known as its router and kept at host precision.
        described[path] = banks.describe(model, path, mod)
        if not banks.bank_refusal(mod):
            held[path] = {n: cast(torch.Tensor, mod._parameters[n]).detach()
                          for n in (banks.GATE_UP, banks.DOWN)}
    if described:
        graph.modules = [described.get(m.path, m) for m in graph.modules]
    layer: Any = head(model)  # an engine layer: its weight and quant_method are its own
    if layer is not None:
        # A tied head is the embedding module itself: named here by the attribute the logits
        # processor reads, so the head and the lookup are two sites over one weight.
        modules = [m for m in graph.modules if m.path != HEAD_ATTR]
        graph.modules = modules + [head_module(HEAD_ATTR, layer)]
        graph.output_head = HEAD_ATTR
        held[HEAD_ATTR] = {"weight": layer.weight.detach()}
    return graph, hooked, held


def observe_forward(model: nn.Module, graph: _core.HostGraph, hooked: list,
                    held: dict[str, dict[str, torch.Tensor]]) -> None:
    """One decode-shaped forward through the finished host (the engine's profiling form: no
    attention metadata) and one logits computation, observed; the banks' calls through their
    methods' apply (`banks.CallObserver`)."""
    from vllm.config import get_current_vllm_config
    from vllm.forward_context import set_forward_context

    layer: Any = head(model)  # an engine layer: its weight and quant_method are its own
    head_calls: list[_core.HostCall] = []
    keep: list[torch.Tensor] = []

    def forward() -> None:
        ids = torch.zeros(1, dtype=torch.long)
        pos = torch.zeros(1, dtype=torch.long)
        with set_forward_context(None, get_current_vllm_config()):
            hidden = model(ids, pos)
        if layer is None or not hasattr(model, "compute_logits"):
            return
        method = layer.quant_method

        def apply(lyr, x, bias=None):
            out = method.apply(lyr, x, bias=bias)
            keep.extend((x, out))
            head_calls.append(observe.host_call(HEAD_ATTR, x, out))
            return out
        layer.quant_method = HeadMethod(method, apply)
        try:
            cast(Any, model).compute_logits(hidden)
        finally:
            layer.quant_method = method

    with banks.CallObserver(model, graph, held) as bank_calls:
        observe.record_calls(graph, hooked, [forward])
    no_norms(graph)
    graph.calls = list(graph.calls) + head_calls
    bank_calls.write(graph)
    keep.clear()
    # A module whose observed calls take token ids is a lookup, not a projection.
    lookups = {c.path for c in graph.calls if c.dtype == _core.DType.other}
    modules = list(graph.modules)
    for m in modules:
        if m.path in lookups and m.kind == _core.ModuleKind.linear:
            m.kind = _core.ModuleKind.embedding
            graph.input_embedding = graph.input_embedding or m.path
    graph.modules = modules
    graph.calls = [c for c in graph.calls if c.path not in lookups]


def undescribed(model: nn.Module) -> list[tuple[str, str]]:
    """The engine's weight-holding layers that are neither projections nor seatable banks (read
    before the engine repacks anything), each named with why it stays with vLLM: a bank with
    what the bank op cannot compute, any other layer with its tensors' shapes (no catalog
    structure describes it)."""
    out = []
    for path, mod in model.named_modules():
        params = {n: t for n, t in mod._parameters.items() if t is not None}
        if (getattr(mod, "quant_method", None) is None or not params
                or observe.engine_projection(mod)):
            continue
        if banks.engine_bank(mod):
            if why := banks.bank_refusal(mod):
                out.append((path, why))
            continue
        shapes = ", ".join(f"{n} {list(t.shape)} {str(t.dtype).replace('torch.', '')}"
                           for n, t in params.items())
        out.append((path, f"{type(mod).__name__} holds {shapes}: no structure in the catalog "
                          "describes this layer"))
    return out

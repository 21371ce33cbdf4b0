"""Reading SGLang's model in the hook's window (Note [The window in SGLang]): what refuses the
whole engine, the tree described and the weights held before SGLang may repack them, the layers
SGLang's own compiled kernels took, the observed calls after, and the layers no structure
describes."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from .. import _core, observe
from ..engine_door import head_module, no_norms
from . import attention
from .adapters import HEAD_ATTR, LOGITS_ATTR, head_layer, host_logits


def whole_engine_refusal(model: nn.Module) -> str:
    """Why no seat may stand in this engine at all, or ""."""
    try:
        from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_world_size
        tp = get_tensor_model_parallel_world_size()
    except Exception as e:  # noqa: BLE001 - unread is refused: a shard must never be seated
        return (f"SGLang's tensor parallel size could not be read ({type(e).__name__}: {e}); "
                "the seats take whole projections (tp = 1)")
    if tp > 1:
        return (f"tensor parallel size {tp}: each process holds a shard of every projection and "
                "SGLang reduces across processes; the seats take whole projections (tp = 1)")
    quant = getattr(model, "quant_config", None)
    if quant is not None:
        name = quant.get_name() if callable(getattr(quant, "get_name", None)) else type(quant)
        return (f"quantized checkpoint ({name}): its projections hold weights in the "
                "checkpoint's own form; adopting them (adopt_prequantized) is not built for SGLang")
    try:
        from sglang.srt.runtime_context import get_lora
        lora = bool(get_lora().enable_lora)
    except Exception:  # noqa: BLE001 - no LoRA settings: none enabled
        lora = False
    if lora:
        return ("LoRA enabled: SGLang wraps each linear layer in a LoRA layer chosen by the "
                "layer's class, which a seat is not")
    return ""


def _plain_method(mod: nn.Module) -> bool:
    """Whether a layer's weight is applied by SGLang's unquantized method (a model that keeps no
    quant_config may still hold a quantized layer)."""
    return type(getattr(mod, "quant_method", None)).__name__.startswith("Unquantized")


def head_refusal(model: nn.Module) -> str:
    """Why the head stays SGLang's even where the linears are seated, or "": its logits are asked
    in another precision than the head's weight (fp32 logits, the RL on-policy bf16 path)."""
    processor = getattr(model, LOGITS_ATTR, None)
    if getattr(processor, "use_fp32_lm_head", False):
        return "SGLang computes the logits in fp32 (enable_fp32_lm_head): the head stays SGLang's"
    if getattr(processor, "rl_on_policy_target", None) is not None:
        return ("SGLang computes the logits on its RL on-policy bf16 path (rl_on_policy_target): "
                "the head stays SGLang's")
    return ""


def _lookup(mod: nn.Module) -> bool:
    """SGLang's token embedding (a VocabParallelEmbedding that is not the head class)."""
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    return isinstance(mod, VocabParallelEmbedding) and not isinstance(mod, ParallelLMHead)


def projections(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The linear layers a plan may seat: a 2-D weight applied by a quant method, neither the
    lookup nor the head."""
    head = head_layer(model)
    return [(p, m) for p, m in model.named_modules()
            if observe.engine_projection(m) and not _lookup(m) and m is not head]


def attention_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """SGLang's attention layers (RadixAttention), whose decode batches a seat may serve."""
    return [(p, m) for p, m in model.named_modules() if attention.is_layer(m)]


def sites(model: nn.Module) -> list[str]:
    """The sites a whole-engine refusal names: every linear layer, the head, every attention
    layer, and every other weight-holding layer the door would have named (the fused expert banks
    among them)."""
    out = [p for p, _ in projections(model)] + ([HEAD_ATTR] if head_layer(model) else [])
    out += [p for p, _ in attention_layers(model)]
    return out + [p for p, _ in undescribed(model) if p not in set(out)]


def repacked(model: nn.Module) -> list[tuple[str, str]]:
    """After SGLang's post-processing: the layers its compiled CPU kernels repacked
    (`use_intel_amx_backend`), each refused with that reason. Read from the flag on every module,
    not from the weight's shape, which the repacked copy need not keep."""
    why = ("SGLang's own compiled CPU kernel (sgl_kernel, AMX) repacked this weight for itself; "
           "the door does not seat over a layer SGLang already runs natively")
    head = getattr(model, HEAD_ATTR, None)
    out = [(p, why) for p, m in model.named_modules()
           if getattr(m, "use_intel_amx_backend", False) and m is not head]
    if head is not None and getattr(head, "use_intel_amx_backend", False):
        out.append((HEAD_ATTR, why))
    return out


def describe(model: nn.Module) -> tuple[_core.HostGraph, list, dict[str, dict[str, torch.Tensor]]]:
    """Before SGLang's post-processing: the tree, the modules to observe, and each linear's and
    the head's tensors held by reference."""
    graph, hooked = observe.describe_tree(model)
    no_norms(graph)
    held: dict[str, dict[str, torch.Tensor]] = {}
    for path, mod in projections(model):
        held[path] = {n: t.detach() for n, t in mod._parameters.items() if t is not None}
    lookups = {p for p, m in model.named_modules() if _lookup(m)}
    layers = dict(attention_layers(model))
    modules = [m for m in graph.modules if m.path != HEAD_ATTR]
    for m in modules:
        if m.path in lookups:
            m.kind = _core.ModuleKind.embedding
            graph.input_embedding = graph.input_embedding or m.path
        elif m.path in layers:
            m.kind = _core.ModuleKind.attention
            m.attention = attention.facts_of(layers[m.path])
    layer: Any = head_layer(model)
    if layer is not None:
        modules.append(head_module(HEAD_ATTR, layer))
        graph.output_head = HEAD_ATTR
        held[HEAD_ATTR] = {"weight": layer.weight.detach()}
    graph.modules = modules
    hooked = [(p, m) for p, m in hooked if p not in lookups]
    return graph, hooked, held


def keep_out(graph: _core.HostGraph, refused: list[tuple[str, str]]) -> None:
    """Sites the door refused itself are no projections to the plan."""
    named = {site for site, _ in refused}
    modules = list(graph.modules)
    for m in modules:
        if m.path in named and m.kind in (_core.ModuleKind.linear, _core.ModuleKind.attention):
            m.kind = _core.ModuleKind.module
    graph.modules = modules


def observe_calls(model: nn.Module, graph: _core.HostGraph, hooked: list,
                  held: dict[str, dict[str, torch.Tensor]]) -> dict[str, bool]:
    """Each linear layer called once on one row in its weight's dtype, through the layer's own
    forward, and the head's logits once through SGLang's own logits computation, observed (a
    whole forward needs a scheduled batch; these are the calls the seats stand in). Returns, per
    linear, whether its call returned `(out, bias)` (most do; a few return the tensor alone)."""
    layer: Any = head_layer(model)
    head_calls: list[_core.HostCall] = []
    keep: list[torch.Tensor] = []
    gen = torch.Generator().manual_seed(0)
    pairs: dict[str, bool] = {}

    def row(width: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.randn(1, width, generator=gen).to(dtype)

    def forward() -> None:
        for path, mod in projections(model):
            if path in held:
                w = held[path]["weight"]
                pairs[path] = isinstance(mod(row(w.shape[1], w.dtype)), tuple)
        if layer is not None:
            x = row(layer.weight.shape[1], layer.weight.dtype)
            out = host_logits(model)(layer, x)
            keep.extend((x, out))
            head_calls.append(observe.host_call(HEAD_ATTR, x, out))

    observe.record_calls(graph, hooked, [forward])
    no_norms(graph)
    # Each attention layer's decode call, in the engine's dtype (declared: Note in attention.py).
    dtype = next((t["weight"].dtype for t in held.values() if "weight" in t), torch.float32)
    seated = {m.path for m in graph.modules if m.kind == _core.ModuleKind.attention}
    declared = [attention.host_call(p, m, dtype) for p, m in attention_layers(model) if p in seated]
    graph.calls = list(graph.calls) + head_calls + declared
    keep.clear()
    return pairs


def undescribed(model: nn.Module) -> list[tuple[str, str]]:
    """The layers that stay with SGLang, each named with why: weight-holding layers that are
    neither linears, the lookup nor the head (its tensors' shapes: no catalog structure describes
    it in this door; SGLang's fused expert banks among them); a fused bank's router, which must
    stay at the bank's own precision so the bank's expert choice is SGLang's; a linear applied by
    a quantized method; the head where its logits are asked in another precision; the attention
    layers where SGLang decodes with another backend than the one the seats stand in."""
    out = []
    head = head_layer(model)
    if head is not None and (why := head_refusal(model)):
        out.append((HEAD_ATTR, why))
    layers = attention_layers(model)
    if layers and (why := attention.backend_refusal()):
        out.extend((p, why) for p, _ in layers)
    for path, mod in projections(model):
        if not _plain_method(mod):
            out.append((path, f"{type(mod.quant_method).__name__} applies this layer's weight "
                              "(a quantized layer): adopting it is not built for SGLang"))
    for path, mod in model.named_modules():
        params = {n: t for n, t in mod._parameters.items() if t is not None}
        if (getattr(mod, "quant_method", None) is None or not params or mod is head
                or observe.engine_projection(mod) or _lookup(mod)):
            continue
        shapes = ", ".join(f"{n} {list(t.shape)} {str(t.dtype).replace('torch.', '')}"
                           for n, t in params.items())
        what = ("a fused expert bank: the SGLang door does not seat expert banks yet"
                if any(cast(torch.Tensor, t).dim() == 3 for t in params.values()) else
                "no structure in the catalog describes this layer")
        out.append((path, f"{type(mod).__name__} holds {shapes}: {what}"))
        if "expert bank" in what:
            parent = path.rpartition(".")[0]
            for name in ("gate", "router"):
                router = f"{parent}.{name}" if parent else name
                sub = dict(model.named_modules()).get(router)
                if sub is not None and observe.engine_projection(sub):
                    out.append((router, f"router of {path}, whose bank stays SGLang's: kept at "
                                        "host precision so the bank's expert choice is SGLang's"))
    return out

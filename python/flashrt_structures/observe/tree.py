"""The module tree as the core sees it: each module's kind, slot tensors and measured form,
and the host's declared configuration (head counts, rotary form, sliding window).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from .. import _core
from ..seats import PackLead, PackMember, SeatModule
from .experts import describe_bank, find_router
from .functions import called_functions, describe_conv, describe_recurrence
from .probes import bare_leaf, dtype_of, measure_activation, measure_norm, wrapped_linear


def _path_of(model: nn.Module, target: nn.Module | None) -> str:
    if target is None:
        return ""
    for name, mod in model.named_modules():
        if mod is target:
            return name
    return ""


def _rope_name(config: object) -> str:
    """The declared rotary form; where the configuration declares one per layer type (Gemma 3),
    the scaled kind among them ("default" when none is scaled)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not params:
        return "default"
    if all(isinstance(v, dict) for v in params.values()):
        # Every scaled kind must be one the program computes: several read as one name that is
        # none of them ("linear+longrope"), so the plan refuses it.
        names = sorted({str(v.get("rope_type", v.get("type", "default"))) for v in params.values()}
                       - {"default"})
        return "+".join(names) if names else "default"
    return str(params.get("rope_type", params.get("type", "default")))


def _positive(value: object) -> float:
    """A declared scalar, 0 where the configuration leaves it unset."""
    return float(value) if isinstance(value, (int, float)) and value > 0 else 0.0


def config_facts(model: nn.Module) -> _core.HostConfig:
    """What the host's configuration declares that the structure of its modules cannot show:
    head counts, the rotary form, a sliding window that applies."""
    facts = _core.HostConfig()
    first = next(iter(model.parameters()), None)
    if first is not None:
        facts.dtype = dtype_of(first.dtype)
    cfg = getattr(model, "config", None)
    if cfg is None:
        return facts
    for key, name in (("heads", "num_attention_heads"), ("kv_heads", "num_key_value_heads"),
                      ("head_dim", "head_dim"), ("intermediate", "intermediate_size")):
        value = getattr(cfg, name, None)
        if isinstance(value, int):
            setattr(facts, key, value)
    facts.rope_name = _rope_name(cfg)
    facts.rope = _core.RopeKind.__members__.get(facts.rope_name, _core.RopeKind.other)
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    original = rope.get("original_max_position_embeddings",
                        getattr(cfg, "original_max_position_embeddings", None))
    if isinstance(original, int) and original > 0:
        facts.rope_original_max = original
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None) or []
    if all(isinstance(t, str) for t in types):
        facts.layer_types = list(types)
    # A window applies where a layer type says so, where the family switches it on, or (no layer
    # types declared) wherever it is set: Mistral's attention reads it on every layer.
    sliding = (getattr(cfg, "use_sliding_window", False) or "sliding_attention" in types
               or (not types and not hasattr(cfg, "use_sliding_window")))
    if isinstance(window, int) and window > 0 and sliding:
        facts.sliding_window = window
    no_rope = getattr(cfg, "no_rope_layers", None)
    if isinstance(no_rope, (list, tuple)) and all(isinstance(v, int) for v in no_rope):
        facts.rope_layers = [int(v) for v in no_rope]
    for key in ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
                "logits_scaling", "query_pre_attn_scalar", "attn_logit_softcapping",
                "final_logit_softcapping", "clip_qkv"):
        setattr(facts, key, _positive(getattr(cfg, key, None)))
    return facts


def engine_projection(mod: nn.Module) -> bool:
    """A serving engine's projection layer, recognised by what it holds rather than its class: a
    2-D weight [out, in] applied by a `quant_method` (vLLM's linear layers and its head)."""
    w = mod._parameters.get("weight")
    method = getattr(mod, "quant_method", None)
    return (isinstance(w, torch.Tensor) and w.dim() == 2
            and callable(getattr(method, "apply", None)))


def _describe(path: str, mod: nn.Module) -> tuple[_core.HostModule, bool]:
    """One module as the core sees it, and whether its calls are worth observing."""
    hm = _core.HostModule()
    hm.path = path
    hm.type_name = type(mod).__name__
    hm.children = [f"{path}.{n}" if path else n for n, _ in mod.named_children()]
    if isinstance(mod, (PackLead, PackMember)):
        # A pack's module computes what its host projection does and nothing is read from its
        # core seat (several projections'), so it is described as that projection.
        mod = mod.host
    if isinstance(mod, SeatModule) and mod.seat.form.op == _core.OpKind.rmsnorm:
        # A norm's seat computes its host's form with its host's weight and epsilon: described
        # as that norm (a decode program reads them from it).
        mod = mod.host
    if isinstance(mod, SeatModule):
        # A seat stands here: it computes what its host did, with the op its form names.
        form = mod.seat.form
        hm.kind = _core.ModuleKind.module
        hm.in_features, hm.out_features = form.width, form.out
        hm.has_bias = getattr(mod.host, "bias", None) is not None
        hm.seated = form.op
        return hm, False
    if (bank := describe_bank(mod)) is not None:
        # Observed: its calls carry the router's choice and show its gated form (measured).
        down = cast(torch.Tensor, getattr(mod, bank.down))
        hm.kind = _core.ModuleKind.experts
        hm.experts = bank
        hm.in_features = hm.out_features = bank.hidden
        hm.weight_dtype = dtype_of(down.dtype)
        hm.weight_device = down.device.type
        hm.weight_id = down.data_ptr()
        return hm, True
    if isinstance(mod, nn.Linear):
        hm.kind = _core.ModuleKind.linear
        hm.in_features, hm.out_features = mod.in_features, mod.out_features
        hm.has_bias = mod.bias is not None
        hm.weight_dtype = dtype_of(mod.weight.dtype)
        hm.weight_device = mod.weight.device.type
        hm.weight_id = mod.weight.data_ptr()
        return hm, True
    if engine_projection(mod):
        w = cast(torch.Tensor, mod.weight)
        hm.kind = _core.ModuleKind.linear
        hm.out_features, hm.in_features = w.shape
        # A bias the layer hands back (skip_bias_add) is added by its caller, not by the layer.
        hm.has_bias = (getattr(mod, "bias", None) is not None
                       and not getattr(mod, "skip_bias_add", False))
        hm.weight_dtype = dtype_of(w.dtype)
        hm.weight_device = w.device.type
        hm.weight_id = w.data_ptr()
        return hm, True
    if isinstance(mod, nn.Embedding):
        hm.kind = _core.ModuleKind.embedding
        hm.in_features, hm.out_features = mod.num_embeddings, mod.embedding_dim
        hm.weight_dtype = dtype_of(mod.weight.dtype)
        hm.weight_id = mod.weight.data_ptr()
        hm.embed_scale = _embed_scale(mod)
        return hm, False
    if (act := measure_activation(mod)) is not None:
        hm.kind = _core.ModuleKind.activation
        hm.activation = act
        return hm, True
    if (norm := measure_norm(mod)) is not None:
        hm.kind = _core.ModuleKind.norm
        hm.in_features = norm[0]
        hm.weight_dtype = dtype_of(cast(torch.Tensor, mod.weight).dtype)
        hm.norm = norm[1]
        return hm, True  # observed: a norm seat serves the calls it was seen to take
    if (recurrence := describe_recurrence(mod)) is not None:
        # Its calls of the rule give the dims (FunctionWatch); its own calls are recorded.
        hm.kind = _core.ModuleKind.recurrence
        hm.recurrence = recurrence
        first = next(iter(mod.parameters()), None)
        if first is not None:
            hm.weight_dtype = dtype_of(first.dtype)
        return hm, True
    hm.kind = _core.ModuleKind.module
    if wrapped_linear(mod) is not None:
        return hm, True  # observed: it is an activation node if its call shows one
    if (rotary := _rotary_tables(mod)) is not None:
        hm.rotary = rotary
    # Observed: a norm without affine if its call shows one; a container, whose calls show whether
    # it computes exactly a region of its children (Note [Enclosing site] in
    # core/src/planner/discover.cpp).
    return hm, bare_leaf(mod) or bool(hm.children)


def _rotary_tables(mod: nn.Module) -> _core.RotaryFacts | None:
    """A rotary embedding's own frequencies and cos/sin scale: one table (`inv_freq`), or one per
    layer type (`<type>_inv_freq`, Gemma 3's local and global bases)."""
    rotary = _core.RotaryFacts()
    # The table the module was built with: a module that rescales with position (LongRoPE past
    # its pretraining length) overwrites inv_freq in place and keeps the original beside it.
    inv_freq = getattr(mod, "original_inv_freq", None)
    if not isinstance(inv_freq, torch.Tensor):
        inv_freq = getattr(mod, "inv_freq", None)
    if isinstance(inv_freq, torch.Tensor) and inv_freq.dim() == 1:
        rotary.inv_freq = inv_freq.detach().float().tolist()
        rotary.attention_scaling = float(getattr(mod, "attention_scaling", 1.0))
    tables, scales = {}, {}
    buffers = dict(mod.named_buffers(recurse=False))
    for name, buf in buffers.items():
        if name.endswith("_inv_freq") and not name.endswith("original_inv_freq") and buf.dim() == 1:
            kind = name[: -len("_inv_freq")]
            buf = buffers.get(f"{kind}_original_inv_freq", buf)
            tables[kind] = buf.detach().float().tolist()
            scales[kind] = float(getattr(mod, f"{kind}_attention_scaling", 1.0))
    rotary.inv_freq_of, rotary.attention_scaling_of = tables, scales
    return rotary if rotary.inv_freq or tables else None


def _embed_scale(mod: nn.Embedding) -> float:
    """What the embedding's call multiplies its rows by (Gemma: sqrt(hidden), in the weight's
    dtype), measured on a call of three rows; 0 when its call is not its rows times one
    constant."""
    ids = torch.arange(min(3, mod.num_embeddings)).unsqueeze(0)
    with torch.no_grad():
        out = mod(ids)[0].float()
    rows = mod.weight.detach()[ids[0]].float()
    if torch.equal(out, rows):
        return 1.0
    nonzero = rows != 0
    if not bool(nonzero.any()):
        return 0.0
    # The constant in fp32, as the host multiplies by it (the ratios in float64 straddle it).
    ratio = out[nonzero].double() / rows[nonzero].double()
    scale = torch.tensor(float(ratio.median()), dtype=torch.float32)
    return float(scale) if torch.equal(out, rows * scale) else 0.0


def _param(path: str, name: str, p: torch.Tensor) -> _core.HostParam:
    hp = _core.HostParam()
    hp.module, hp.name = path, name
    hp.shape = list(p.shape)
    hp.elements = p.numel()
    return hp


def describe_tree(model: nn.Module) -> tuple[_core.HostGraph, list[tuple[str, nn.Module]]]:
    """The module tree as a HostGraph (no calls yet), and the modules whose calls to observe."""
    graph = _core.HostGraph()
    modules = []
    params = []
    hooked: list[tuple[str, nn.Module]] = []
    by_path = dict(model.named_modules())
    for path, mod in by_path.items():
        hm, hook = _describe(path, mod)
        if hm.kind == _core.ModuleKind.experts:
            parent_path, _, name = path.rpartition(".")
            bank = hm.experts
            bank.router = find_router(by_path[parent_path], parent_path, name, bank)
            hm.experts = bank
        parent = by_path[path.rpartition(".")[0]]
        if (hm.kind == _core.ModuleKind.module and (conv := describe_conv(mod)) is not None
                and any(f.is_conv for f in called_functions(parent))):
            # A convolution whose parent hands its weight to a convolution function: the
            # function's calls are its calls (FunctionWatch).
            w = cast(torch.Tensor, mod.weight)
            hm.kind = _core.ModuleKind.conv
            hm.conv = conv
            hm.in_features = hm.out_features = conv.channels
            hm.weight_dtype = dtype_of(w.dtype)
            hm.weight_id = w.data_ptr()
            hook = False
        modules.append(hm)
        if hook:
            hooked.append((path, mod))
        for name, p in mod._parameters.items():
            if isinstance(p, torch.Tensor) and p.dim() >= 2:
                params.append(_param(path, name, p))
    graph.modules = modules
    graph.params = params
    graph.config = config_facts(model)
    get_out = getattr(model, "get_output_embeddings", None)
    get_in = getattr(model, "get_input_embeddings", None)
    graph.output_head = _path_of(model, get_out()) if callable(get_out) else ""
    graph.input_embedding = _path_of(model, get_in()) if callable(get_in) else ""
    return graph, hooked

"""Observation: turns `model, forward` into the core's neutral HostGraph.

What is recorded is structural: module kinds, slot tensors (shape, dtype, identity), what an
activation module computes (measured, not read from its class), and what one real forward showed
(rows per call, dtypes, which calls shared a tensor, call order). Nothing is matched on type or
model names; the planner in the core does the matching.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import cast

import torch
from torch import nn

from . import _core
from .seats import PackLead, PackMember, SeatModule

Forward = Callable[[], object]

_DTYPES = {torch.float32: _core.DType.f32, torch.bfloat16: _core.DType.bf16,
           torch.float16: _core.DType.f16, torch.float64: _core.DType.f64}


def dtype_of(dt: torch.dtype) -> _core.DType:
    return _DTYPES.get(dt, _core.DType.other)


def normalise_forwards(forward: Forward | Iterable[Forward]) -> list[Forward]:
    """One zero-argument callable, or a list of them (one per sample)."""
    if callable(forward):
        return [forward]
    thunks = list(forward)
    if not thunks or not all(callable(f) for f in thunks):
        raise ValueError("forward must be a zero-argument callable or a non-empty list of them")
    return thunks


_PROBE = torch.linspace(-6.0, 6.0, 121)
# The torch reference of each activation the core names (flashrt/types.h): what a module is
# measured against. Names come from the core's enum, so there is one list of them.
_REFERENCE_ACTIVATIONS: dict[_core.Activation, Callable[[torch.Tensor], torch.Tensor]] = {
    _core.Activation.silu: torch.nn.functional.silu,
    _core.Activation.gelu_tanh: lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
    _core.Activation.gelu: torch.nn.functional.gelu,
    _core.Activation.relu: torch.relu,
}


def measure_activation(module: nn.Module) -> _core.Activation | None:
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
    for act, fn in _REFERENCE_ACTIVATIONS.items():
        if torch.allclose(y, fn(_PROBE), atol=1e-5, rtol=1e-5):
            return act
    return _core.Activation.unknown


def measure_norm(module: nn.Module) -> tuple[int, _core.NormFacts] | None:
    """(width, its form and epsilon) for a leaf module with a 1-D weight that normalises its
    input's last dimension, by evaluating it: rms is x·w/rms(x), rms_one_plus x·(1+w)/rms(x),
    other anything else it computes over that width. None when the module is not such a leaf."""
    w = getattr(module, "weight", None)
    if (not isinstance(w, torch.Tensor) or w.dim() != 1 or any(True for _ in module.children())
            or w.dtype not in _DTYPES or w.device.type != "cpu"):
        return None
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not isinstance(eps, (int, float)):
        return None
    width = w.shape[0]
    probe = torch.randn(2, width, generator=torch.Generator().manual_seed(5)).to(w.dtype)
    try:
        with torch.no_grad():
            got = module(probe)
    except Exception:  # noqa: BLE001 - not a norm over its weight's width
        return None
    if not isinstance(got, torch.Tensor) or got.shape != probe.shape:
        return None
    with torch.no_grad():
        p = probe.float()
        normed = p * torch.rsqrt(p.pow(2).mean(-1, keepdim=True) + eps)
        forms = {_core.NormForm.rms: normed * w.float(),
                 _core.NormForm.rms_one_plus: normed * (1.0 + w.float())}
    form = _core.NormForm.other
    for name, want in forms.items():
        if torch.allclose(got.float(), want, rtol=1e-4, atol=1e-5):
            form = name
            break
    return width, _core.NormFacts(form, float(eps))


def _wrapped_linear(mod: nn.Module) -> nn.Linear | None:
    """The one Linear child of a parameter-free module that may apply an activation to it (a
    projection-then-activation module, as diffusers' GELU); None otherwise."""
    children = list(mod.children())
    if (len(children) != 1 or not isinstance(children[0], nn.Linear)
            or any(True for _ in mod.parameters(recurse=False))):
        return None
    return children[0]


def measure_wrapped(inner: torch.Tensor, outer: torch.Tensor) -> _core.Activation | None:
    """What a wrapping module computed on its Linear's output, from one observed call: the
    reference activation that maps the Linear's output to the module's, or None (anything
    else it computes leaves it a plain module)."""
    if inner.shape != outer.shape or inner.dtype != outer.dtype or torch.equal(inner, outer):
        return None
    with torch.no_grad():
        for act, fn in _REFERENCE_ACTIVATIONS.items():
            if torch.allclose(outer.float(), fn(inner.float()), atol=1e-5, rtol=1e-4):
                return act
    return None


def _bare_leaf(mod: nn.Module) -> bool:
    """A leaf module without parameters: a norm without affine may be one (measured on its call)."""
    return (not any(True for _ in mod.children())
            and not any(True for _ in mod.parameters(recurse=False)))


def measure_bare_norm(x: torch.Tensor, out: torch.Tensor, eps: float) -> _core.NormForm | None:
    """What a parameter-free module computed on one observed call when it normalises the last
    dimension: layer (x - mean) / std, rms x / rms(x); None otherwise. Read on up to 64 rows."""
    if (out is x or out.shape != x.shape or x.dim() < 2 or x.shape[-1] < 2
            or not x.is_floating_point() or not out.is_floating_point()):
        return None
    with torch.no_grad():
        xs = x.reshape(-1, x.shape[-1])[:64].float()
        got = out.reshape(-1, out.shape[-1])[:64].float()
        if torch.equal(xs, got):
            return None
        tol = 1e-3 if out.dtype == torch.float32 else 3e-2
        forms = {_core.NormForm.layer: torch.nn.functional.layer_norm(xs, xs.shape[-1:],
                                                                        eps=eps),
                 _core.NormForm.rms: xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps)}
        for name, want in forms.items():
            if torch.allclose(got, want, atol=tol, rtol=tol):
                return name
    return None


def fit_modulation(n: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether x is a per-channel affine function of n (x = n*scale + shift, scale and shift per
    channel and per leading sample), fitted over the rows, and not n itself."""
    if x is n or x.shape != n.shape or x.dim() < 2 or x.shape[-1] < 2:
        return False
    with torch.no_grad():
        batch = x.shape[0] if x.dim() >= 3 else 1
        xs = x.reshape(batch, -1, x.shape[-1]).double()
        ns = n.reshape(batch, -1, n.shape[-1]).double()
        if xs.shape[1] < 4:  # too few rows to tell a per-channel fit from a coincidence
            return False
        mx, mn = xs.mean(1, keepdim=True), ns.mean(1, keepdim=True)
        var = (ns - mn).pow(2).mean(1, keepdim=True)
        scale = ((ns - mn) * (xs - mx)).mean(1, keepdim=True) / var.clamp_min(1e-30)
        shift = mx - scale * mn
        resid = xs - (ns * scale + shift)
        tol = 1e-4 if x.dtype == torch.float32 else 2e-2
        if resid.norm() > tol * xs.norm():
            return False
        return not (torch.allclose(scale, torch.ones_like(scale), atol=1e-6)
                    and torch.allclose(shift, torch.zeros_like(shift), atol=1e-6))


def _sources(model: nn.Module, path: str) -> str:
    """What a module's own forward can compute a modulation from: its own parameters and its
    direct Linear children, with their shapes; else its arguments."""
    mod = model.get_submodule(path) if path else model
    items = [f"{name} {list(p.shape)}" for name, p in mod.named_parameters(recurse=False)]
    items += [f"{path + '.' if path else ''}{name} [{c.out_features}x{c.in_features}]"
              for name, c in mod.named_children() if isinstance(c, nn.Linear)]
    return ", ".join(items) if items else "its forward's arguments"


def _path_of(model: nn.Module, target: nn.Module | None) -> str:
    if target is None:
        return ""
    for name, mod in model.named_modules():
        if mod is target:
            return name
    return ""


def _rows(t: torch.Tensor) -> int:
    return math.prod(t.shape[:-1]) if t.dim() >= 1 else 1


def _rope_name(config: object) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not params:
        return "default"
    return str(params.get("rope_type", params.get("type", "default")))


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
    params = getattr(cfg, "rope_parameters", None) or {}
    partial = getattr(cfg, "partial_rotary_factor", None)
    if partial is None and isinstance(params, dict):
        partial = params.get("partial_rotary_factor")
    if isinstance(partial, (int, float)):
        facts.partial_rotary_factor = float(partial)
    window = getattr(cfg, "sliding_window", None)
    sliding = getattr(cfg, "use_sliding_window", False) or "sliding_attention" in (
        getattr(cfg, "layer_types", None) or [])
    if isinstance(window, int) and window > 0 and sliding:
        facts.sliding_window = window
    return facts


def engine_projection(mod: nn.Module) -> bool:
    """A serving engine's projection layer, recognised by what it holds rather than its class: a
    2-D weight [out, in] applied by a `quant_method` (vLLM's linear layers and its head)."""
    w = mod._parameters.get("weight")
    method = getattr(mod, "quant_method", None)
    return (isinstance(w, torch.Tensor) and w.dim() == 2
            and callable(getattr(method, "apply", None)))


def _first_tensor(out: object) -> object:
    """An engine's projection returns (output, bias): the output is its first element."""
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return out


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
    if isinstance(mod, SeatModule):
        # A seat stands here: it computes what its host did, with the op its form names.
        form = mod.seat.form
        hm.kind = _core.ModuleKind.module
        hm.in_features, hm.out_features = form.width, form.out
        hm.has_bias = getattr(mod.host, "bias", None) is not None
        hm.seated = form.op
        return hm, False
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
        return hm, False
    hm.kind = _core.ModuleKind.module
    if _wrapped_linear(mod) is not None:
        return hm, True  # observed: it is an activation node if its call shows one
    inv_freq = getattr(mod, "inv_freq", None)  # a rotary embedding's own frequencies
    if isinstance(inv_freq, torch.Tensor) and inv_freq.dim() == 1:
        rotary = _core.RotaryFacts()
        rotary.inv_freq = inv_freq.detach().float().tolist()
        rotary.attention_scaling = float(getattr(mod, "attention_scaling", 1.0))
        hm.rotary = rotary
    # Observed: a norm without affine if its call shows one; a container, whose calls show whether
    # it computes exactly a region of its children (the planner's Note [Enclosing site]).
    return hm, _bare_leaf(mod) or bool(hm.children)


def describe_tree(model: nn.Module) -> tuple[_core.HostGraph, list[tuple[str, nn.Module]]]:
    """The module tree as a HostGraph (no calls yet), and the modules whose calls to observe."""
    graph = _core.HostGraph()
    modules = []
    hooked: list[tuple[str, nn.Module]] = []
    for path, mod in model.named_modules():
        hm, hook = _describe(path, mod)
        modules.append(hm)
        if hook:
            hooked.append((path, mod))
    graph.modules = modules
    graph.config = config_facts(model)
    get_out = getattr(model, "get_output_embeddings", None)
    get_in = getattr(model, "get_input_embeddings", None)
    graph.output_head = _path_of(model, get_out()) if callable(get_out) else ""
    graph.input_embedding = _path_of(model, get_in()) if callable(get_in) else ""
    return graph, hooked


def host_call(path: str, x: torch.Tensor, output: torch.Tensor) -> _core.HostCall:
    """One observed call of the module at `path`: rows, width, dtype, tensor identities (the
    caller keeps x and output alive until observation ends, so no id is reused)."""
    c = _core.HostCall()
    c.path = path
    c.rows = _rows(x)
    c.width = x.shape[-1] if x.dim() else 1
    c.dtype = dtype_of(x.dtype)
    c.input_id, c.output_id = id(x), id(output)
    return c


def record_calls(graph: _core.HostGraph, hooked: list[tuple[str, nn.Module]],
                 forwards: list[Forward], model: nn.Module | None = None) -> None:
    """Runs the forwards with the hooked modules observed; sets graph.calls. With `model`, where
    a norm's output is modulated is located too (the modules that hold the norms are observed)."""
    calls: list[_core.HostCall] = []
    keep: list[torch.Tensor] = []  # holds every observed tensor so no id is reused meanwhile
    last_out: dict[int, torch.Tensor] = {}  # id(module) -> its latest output
    wrapped: dict[str, _core.Activation | None] = {}  # wrapper path -> what its calls showed
    # Norms without affine (parameter-free modules measured on their calls) and the modulation
    # of their outputs: which projection inputs are n*scale + shift of a norm's output n.
    bare = {path for path, mod in hooked if _bare_leaf(mod) and measure_activation(mod) is None}
    # bare path -> measured form (None once a call is not one)
    norms: dict[str, _core.NormForm | None] = {}
    norm_outs: list[tuple[str, torch.Tensor]] = []  # recent norm outputs, newest last
    modulated: dict[int, tuple[int, str] | None] = {}  # id(x) -> (id(n), norm path)
    returned: dict[int, tuple[str, int]] = {}  # id(first output) -> (module path, outputs)
    where: dict[str, str] = {}  # norm path -> where its output was modulated
    parents = {path.rpartition(".")[0] for path in bare}
    by_path = dict(model.named_modules()) if model is not None else {}

    def modulation_of(x: torch.Tensor) -> tuple[int, str] | None:
        if id(x) in modulated:
            return modulated[id(x)]
        found = None
        for npath, n in reversed(norm_outs[-4:]):
            if n.shape == x.shape and fit_modulation(n, x):
                found = (id(n), npath)
                owner = npath.rpartition(".")[0]
                if npath not in where:
                    ret = returned.get(id(x))
                    tail = ""
                    if ret is not None and ret[0] == owner:
                        tail = (f", which returns it with {ret[1] - 1} more tensors" if ret[1] > 1
                                else ", which returns it")
                    where[npath] = (f"in {owner or '(root)'}.forward from "
                                    f"{_sources(model, owner) if model is not None else '?'}{tail}")
                break
        modulated[id(x)] = found
        return found

    def parent_hook(path: str):
        def hook(mod, args, output):
            first = _first_tensor(output)
            if isinstance(first, torch.Tensor):
                keep.append(first)
                returned[id(first)] = (path, len(output) if isinstance(output, tuple) else 1)
        return hook

    def hook_for(path: str):
        def hook(mod, args, output):
            if path in bare:
                x = args[0] if args else None
                if not isinstance(x, torch.Tensor) or not isinstance(output, torch.Tensor):
                    return
                form = measure_bare_norm(x, output, float(getattr(mod, "eps", 1e-6)))
                norms[path] = form if norms.get(path, form) == form else None
                if form is not None:
                    keep.extend((x, output))
                    norm_outs.append((path, output))
                    calls.append(host_call(path, x, output))
                return
            output = _first_tensor(output)
            if (not args or not isinstance(args[0], torch.Tensor)
                    or not isinstance(output, torch.Tensor)):
                return
            x = args[0]
            last_out[id(mod)] = output
            inner_mod = None if isinstance(mod, nn.Linear) else _wrapped_linear(mod)
            if inner_mod is not None:
                # A projection-then-activation module: the activation node reads the Linear's
                # output, so its call is recorded with that tensor as input.
                inner = last_out.get(id(inner_mod))
                act = None if inner is None else measure_wrapped(inner, output)
                wrapped[path] = act if wrapped.get(path, act) == act else None
                if act is None or inner is None:
                    return
                x = inner
            keep.extend((x, output))
            call = host_call(path, x, output)
            if norm_outs and (mod_of := modulation_of(x)) is not None:
                call.modulated_from = mod_of[0]
            calls.append(call)
        return hook

    handles = [mod.register_forward_hook(hook_for(path)) for path, mod in hooked]
    handles += [by_path[p].register_forward_hook(parent_hook(p)) for p in parents if p in by_path]
    try:
        with torch.no_grad():
            for fwd in forwards:
                fwd()
    finally:
        keep.clear()
        last_out.clear()
        norm_outs.clear()
        for h in handles:
            h.remove()
    if any(act is not None for act in wrapped.values()) or any(norms.values()):
        modules = list(graph.modules)
        for hm in modules:
            if (wrapped_act := wrapped.get(hm.path)) is not None:
                hm.kind = _core.ModuleKind.activation
                hm.activation = wrapped_act
            if (norm_form := norms.get(hm.path)) is not None:
                hm.kind = _core.ModuleKind.norm
                hm.norm = _core.NormFacts(norm_form, 0.0, False, where.get(hm.path, ""))
        graph.modules = modules
    graph.calls = list(graph.calls) + calls


def observe(model: nn.Module, forwards: list[Forward]) -> _core.HostGraph:
    """The tree and what the forwards showed: rows, dtypes and which calls shared a tensor."""
    graph, hooked = describe_tree(model)
    record_calls(graph, hooked, forwards, model)
    return graph

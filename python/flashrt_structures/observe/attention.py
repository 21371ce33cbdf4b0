"""Attention seams: modules that call the host's attention interface.

transformers' attention modules do not compute attention themselves: each call looks up the
implementation its configuration names (`config._attn_implementation`) in the attention
interface, `ALL_ATTENTION_FUNCTIONS.get_interface(name, eager_attention_forward)`, and calls it
with q [batch, heads, q_len, head_dim], the cache's k and v [batch, kv_heads, positions,
head_dim], the mask the model built, and the scaling, softcap and window the module passes. The
door stands a router where that lookup lands (Note [Attention routing]) and records, while the
observed forward runs, what each module's calls passed (`AttentionWatch`): the module is an
attention node with those dims and that form.

Note [Attention routing]: the router stands in the very place the host's call resolves, so no
name changes: `sdpa` is the interface's own entry (replaced in its mapping), `eager` is the
modeling module's `eager_attention_forward`, the default every module of that file passes
(replaced in its namespace, as the function seats replace the gated delta rule). Configurations,
their sub-configurations, the masks the model builds and any code that compares the
implementation's name are untouched. A call from a routed module goes to its handler (a seat, or
the watch); any other call, from any model of the process, runs the host's function with the same
arguments, so an unrouted module's output is the host's bit for bit. Each place is counted: the
host's object comes back with its last user. Other implementations (flash attention, flex, a hub
kernel) are not routed: their modules stay with the host.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import _core
from .calls import host_call

# Keywords the host's implementations take that change nothing the op computes (or that the
# seat reads itself); any other keyword with a value (attention sinks `s_aux`, a position bias)
# is a form the op does not compute. `output_router_logits` is the routed-MoE families' flag for
# collecting the routers' logits (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE): transformers threads the
# model's keywords through every layer into the attention call, where it is ignored.
KNOWN_KWARGS = frozenset({"dropout", "scaling", "softcap", "sliding_window", "is_causal",
                          "position_ids", "cache_position", "output_attentions", "use_cache",
                          "past_key_values", "past_key_value", "layer_idx", "position_embeddings",
                          "attention_mask", "token_type_ids", "return_dict", "use_sliding",
                          "output_router_logits"})
EAGER = "eager_attention_forward"  # the name every modeling file gives its default

# A handler: (host implementation, module, query, key, value, mask, kwargs) -> the call's result.
Handler = Callable[[Callable[..., Any], nn.Module, torch.Tensor, torch.Tensor, torch.Tensor,
                    Any, dict[str, Any]], Any]
# id(module) -> (the module, its handler), both weak: a model dropped while routed is freed.
_ROUTES: dict[int, tuple[weakref.ref[nn.Module], weakref.WeakMethod | Callable[..., Any]]] = {}
# (id(the dict the call resolves in), key) -> [that dict, key, the host's function, users]
_PLACES: dict[tuple[int, str], list[Any]] = {}


def _interfaces() -> Any:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    return ALL_ATTENTION_FUNCTIONS


def place_of(module: nn.Module) -> tuple[dict[str, Any], str] | None:
    """Where `module`'s attention call resolves, if it is a place the router stands in: the
    interface's mapping at "sdpa", or its modeling file's namespace at eager_attention_forward.
    None for any other implementation, or a module without a configuration naming one."""
    config = getattr(module, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl == "sdpa":
        return _interfaces()._global_mapping, "sdpa"
    if impl == "eager":
        namespace = getattr(sys.modules.get(type(module).__module__), "__dict__", None)
        if namespace is not None and callable(namespace.get(EAGER)):
            return namespace, EAGER
    return None


def _router(host: Callable[..., Any]) -> Callable[..., Any]:
    def route(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: Any, *args: Any, **kwargs: Any) -> Any:
        entry = _ROUTES.get(id(module))
        if not args and entry is not None and entry[0]() is module:
            handler = entry[1]() if isinstance(entry[1], weakref.WeakMethod) else entry[1]
            if handler is not None:
                return handler(host, module, query, key, value, attention_mask, kwargs)
        return host(module, query, key, value, attention_mask, *args, **kwargs)
    route._flashrt_original = host  # type: ignore[attr-defined]
    return route


def engage(place: tuple[dict[str, Any], str]) -> None:
    """The router stands at `place` (counted; Note [Attention routing])."""
    where, key = place
    slot = (id(where), key)
    if slot in _PLACES:
        _PLACES[slot][3] += 1
        return
    host = where[key]
    _PLACES[slot] = [where, key, host, 1]
    where[key] = _router(host)


def release(place: tuple[dict[str, Any], str]) -> None:
    where, key = place
    entry = _PLACES.get((id(where), key))
    if entry is None:
        return
    entry[3] -= 1
    if entry[3] == 0:
        # Put back only what the router replaced (someone may have registered since).
        if getattr(where.get(key), "_flashrt_original", None) is entry[2]:
            where[key] = entry[2]
        del _PLACES[(id(where), key)]


def host_implementation(module: nn.Module) -> Callable[..., Any] | None:
    """The host's own function for `module`'s calls (under a router standing there)."""
    place = place_of(module)
    if place is None:
        return None
    fn: Any = place[0].get(place[1])
    while hasattr(fn, "_flashrt_original"):
        fn = fn._flashrt_original
    return fn


def route(module: nn.Module, handler: Callable[..., Any]) -> None:
    ref: weakref.WeakMethod | Callable[..., Any] = (
        weakref.WeakMethod(handler) if hasattr(handler, "__self__") else handler)
    _ROUTES[id(module)] = (weakref.ref(module), ref)


def unroute(module: nn.Module, handler: Callable[..., Any] | None = None) -> None:
    """Takes `module`'s route out (only `handler`'s, when given)."""
    entry = _ROUTES.get(id(module))
    if entry is None or entry[0]() is not module:
        return
    if handler is not None:
        current = entry[1]() if isinstance(entry[1], weakref.WeakMethod) else entry[1]
        if current != handler:
            return
    del _ROUTES[id(module)]


def routed(module: nn.Module) -> bool:
    entry = _ROUTES.get(id(module))
    return entry is not None and entry[0]() is module


@dataclass
class _Seen:
    """What one module's attention calls showed."""

    dims: set[tuple[int, int, int, int]] = field(default_factory=set)  # heads, kv, dq, dv
    scales: set[float | None] = field(default_factory=set)
    softcaps: set[float | None] = field(default_factory=set)
    windows: set[int | None] = field(default_factory=set)
    extra: set[str] = field(default_factory=set)
    implementation: str = ""
    queries: list[torch.Tensor] = field(default_factory=list)  # [batch, q_len, heads * dim]


def call_extras(kwargs: dict[str, Any]) -> list[str]:
    """The keywords of a call that ask for something the op does not compute: attention weights
    returned, sinks (`s_aux`), a position bias, anything else it does not know."""
    return sorted(k for k, v in kwargs.items() if v is not None and (
        k not in KNOWN_KWARGS or (k == "output_attentions" and bool(v))))


def attention_facts(facts: _core.AttentionFacts,
                    dims: set[tuple[int, int, int, int]]) -> list[str]:
    """Form softmax and the heads its calls showed (heads, kv heads, q/k and v head sizes), onto
    `facts`; what about them the op does not compute, for form other."""
    facts.form = _core.AttentionForm.softmax
    if len(dims) != 1:
        return [f"its calls had several shapes {sorted(dims)}"]
    why = []
    facts.heads, facts.kv_heads, dq, dv = next(iter(dims))
    facts.head_dim = dq
    if dv != dq:
        why.append(f"value heads of {dv} beside query/key heads of {dq}")
    if facts.kv_heads < 1 or facts.heads % facts.kv_heads:
        why.append(f"{facts.heads} query heads over {facts.kv_heads} kv heads")
    return why


class AttentionWatch:
    """The observed forward with a router where each module's attention call resolves (Note
    [Attention routing]): each module's calls recorded."""

    def __init__(self, model: nn.Module, graph: _core.HostGraph) -> None:
        self.model = model
        self.graph = graph
        self.paths = {id(m): p for p, m in model.named_modules()}
        self.seen: dict[str, _Seen] = {}

    def _record(self, host: Callable[..., Any], module: nn.Module, q: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor, mask: Any, kwargs: dict[str, Any]) -> Any:
        path = self.paths.get(id(module))
        if path is not None and all(isinstance(t, torch.Tensor) and t.dim() == 4
                                    for t in (q, k, v)):
            seen = self.seen.setdefault(path, _Seen())
            seen.dims.add((q.shape[1], k.shape[1], q.shape[3], v.shape[3]))
            seen.scales.add(kwargs.get("scaling"))
            seen.softcaps.add(kwargs.get("softcap"))
            seen.windows.add(kwargs.get("sliding_window"))
            seen.extra.update(call_extras(kwargs))
            config: Any = module.config
            seen.implementation = str(config._attn_implementation)
            seen.queries.append(q.transpose(1, 2).flatten(2))
        return host(module, q, k, v, mask, **kwargs)

    @contextmanager
    def watching(self) -> Iterator[None]:
        routes = [(m, place) for m in self.model.modules()
                  if (place := place_of(m)) is not None and not routed(m)]
        places: list[tuple[dict[str, Any], str]] = []
        try:
            for m, place in routes:
                if not any(p[0] is place[0] and p[1] == place[1] for p in places):
                    engage(place)
                    places.append(place)
                route(m, self._record)
            yield
        finally:
            for m, _ in routes:
                unroute(m, self._record)
            for place in places:
                release(place)

    def write(self) -> None:
        """Each module whose calls reached the interface becomes an attention node, its calls of
        the interface its HostCalls (rows = batch x query tokens, width = heads x head_dim: a
        module called with keywords only shows its forward hooks no input)."""
        modules = list(self.graph.modules)
        calls = list(self.graph.calls)
        for hm in modules:
            seen = self.seen.get(hm.path)
            if seen is None or hm.kind != _core.ModuleKind.module:
                continue
            hm.kind = _core.ModuleKind.attention
            facts = _core.AttentionFacts()
            facts.implementation = seen.implementation
            why = attention_facts(facts, seen.dims)
            for what, values in (("scaling", seen.scales), ("softcap", seen.softcaps),
                                 ("sliding_window", seen.windows)):
                if len(values) > 1:
                    why.append(f"its calls passed several {what} values {sorted(map(str, values))}")
            scale, softcap, window = (next(iter(s)) for s in
                                      (seen.scales, seen.softcaps, seen.windows))
            facts.scale = float(scale) if scale is not None else 0.0
            facts.sliding_window = int(window) if window is not None else 0
            if softcap is not None and float(softcap) > 0:
                facts.softcap = float(softcap)
                facts.form = _core.AttentionForm.softcapped
            if seen.extra:
                why.append("its calls pass " + ", ".join(seen.extra))
            if why:
                facts.form = _core.AttentionForm.other
                facts.other = "; ".join(why)
            hm.attention = facts
            for q in seen.queries:  # alive in `seen`: their ids are not reused
                c = host_call(hm.path, q, q)
                calls.append(c)
        self.graph.modules = modules
        self.graph.calls = calls

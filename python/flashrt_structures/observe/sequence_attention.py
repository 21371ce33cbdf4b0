"""Sequence attention seams: modules whose forward calls torch's scaled_dot_product_attention
themselves over whole sequences (diffusers' attention processors: PixArt's self- and
cross-attention, SD3's and Flux's joint attention over image and text tokens).

The processor is not a module and is not passed one, so a call is attributed to the innermost
container module running when it is made (Note [Whose call is it] in observe/functions.py): the
attention module whose processor called it. The function is wrapped where callers resolve it, the
`torch.nn.functional` namespace (diffusers looks it up there at every call, directly or through
its attention dispatcher's native backend), while the observed forward runs (`SequenceWatch`).
A module that reached torch's function through transformers' attention interface is the
interface watch's (observe/attention.py): its calls are not recorded here.
"""

from __future__ import annotations

import inspect
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import _core
from . import attention as interface
from .calls import host_call
from .functions import Function, running_modules, watched_calls

# torch's function is a builtin without a signature inspect can read: its parameters, in order
# (scale and enable_gqa keyword-only, as torch's schema has them).
_P = inspect.Parameter
SDPA_SIGNATURE = inspect.Signature(
    [_P(name, _P.POSITIONAL_OR_KEYWORD, default=default)
     for name, default in (("query", _P.empty), ("key", _P.empty), ("value", _P.empty),
                           ("attn_mask", None), ("dropout_p", 0.0), ("is_causal", False))]
    + [_P("scale", _P.KEYWORD_ONLY, default=None), _P("enable_gqa", _P.KEYWORD_ONLY,
                                                      default=False)])
IMPLEMENTATION = "torch.nn.functional.scaled_dot_product_attention"


def sdpa_function() -> Function:
    """torch's scaled_dot_product_attention where callers resolve it."""
    namespace: dict[str, Any] = vars(torch.nn.functional)
    return Function(namespace, "torch.nn.functional", "scaled_dot_product_attention", "sdpa")


def bind_sdpa(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """A call's arguments by name, defaults filled; None for a call torch itself would reject
    (the host's function then raises its own error)."""
    try:
        bound = SDPA_SIGNATURE.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def unserved(a: dict[str, Any]) -> str:
    """What a call asks for that the op does not compute, as "the call asks for <it>" ends
    ("" when nothing): the op is every query against the keys of one range per sequence (a mask
    the same for every query: a caption's padding, Note [Key padding as a range]), without
    dropout. The core judges the mask's values."""
    mask = a["attn_mask"]
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dim() > 4
                             or (mask.dim() >= 2 and mask.shape[-2] != 1)):
        shape = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        return f"a mask over queries (attn_mask {shape})"
    if a["is_causal"]:
        return "causal scores (is_causal)"
    if float(a["dropout_p"] or 0.0) > 0:
        return f"dropout (dropout_p {a['dropout_p']})"
    return ""


def key_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """A call's key padding mask as [batch or 1, heads or 1, 1, keys] (torch broadcasts a mask of
    lower rank from the right)."""
    if mask is None or mask.dim() == 4:
        return mask
    return mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


@dataclass
class _Seen:
    """What one module's calls of torch's function showed."""

    dims: set[tuple[int, int, int, int]] = field(default_factory=set)  # heads, kv, dq, dv
    scales: set[float] = field(default_factory=set)
    unserved: dict[str, int] = field(default_factory=dict)  # reason -> calls
    calls: int = 0
    queries: list[torch.Tensor] = field(default_factory=list)  # [batch, q_len, heads * dim]


class SequenceWatch:
    """The observed forward with torch's function wrapped and every container module on the
    running stack: each call recorded against the module whose forward made it."""

    def __init__(self, model: nn.Module, graph: _core.HostGraph) -> None:
        self.model = model
        self.graph = graph
        by_path = dict(model.named_modules())
        self.containers = {id(by_path[m.path]): m.path for m in graph.modules
                           if m.kind == _core.ModuleKind.module and m.path in by_path}
        self.modules = [by_path[p] for p in self.containers.values()]
        self.seen: dict[str, _Seen] = {}

    def _record(self, _fn: Function, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        stack = running_modules()
        owner = next((m for m in reversed(stack) if id(m) in self.containers), None)
        if owner is None or interface.routed(owner):
            return
        a = bind_sdpa(args, kwargs)
        if a is None:
            return
        q, k, v = a["query"], a["key"], a["value"]
        if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
            return
        seen = self.seen.setdefault(self.containers[id(owner)], _Seen())
        seen.calls += 1
        seen.dims.add((q.shape[1], k.shape[1], q.shape[3], v.shape[3]))
        # The scale torch applies: none passed is 1/sqrt(head_dim).
        seen.scales.add(q.shape[3] ** -0.5 if a["scale"] is None else float(a["scale"]))
        if why := unserved(a):
            seen.unserved[why] = seen.unserved.get(why, 0) + 1
        seen.queries.append(q.transpose(1, 2).flatten(2))

    def watching(self) -> AbstractContextManager[None]:
        return watched_calls(self.modules, [sdpa_function()], self._record)

    def write(self) -> None:
        """Each container module whose forward called torch's function becomes an attention
        node reading whole sequences (cache none); its calls are its HostCalls (rows = batch x
        query tokens, width = heads x head_dim)."""
        modules = list(self.graph.modules)
        calls = list(self.graph.calls)
        for hm in modules:
            seen = self.seen.get(hm.path)
            if seen is None or hm.kind != _core.ModuleKind.module:
                continue
            hm.kind = _core.ModuleKind.attention
            facts = _core.AttentionFacts()
            facts.cache = _core.AttentionCache.none
            facts.implementation = IMPLEMENTATION
            why = interface.attention_facts(facts, seen.dims)
            if len(seen.scales) > 1:
                why.append(f"its calls passed several scales {sorted(map(str, seen.scales))}")
            facts.scale = next(iter(seen.scales))
            # What every call asked for is the module's form; what some did, the seat counts
            # per call.
            why += [f"every observed call asks for {reason}"
                    for reason, n in sorted(seen.unserved.items()) if n == seen.calls]
            if why:
                facts.form = _core.AttentionForm.other
                facts.other = "; ".join(why)
            hm.attention = facts
            for q in seen.queries:  # alive in `seen`: their ids are not reused
                calls.append(host_call(hm.path, q, q))
        self.graph.modules = modules
        self.graph.calls = calls

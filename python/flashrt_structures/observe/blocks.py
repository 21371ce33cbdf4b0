"""Decoder layers: how a module's call composes its norms, its attention and its feed-forward,
measured on the observed forward (exact identities on the tensors the call saw).

A candidate is a module with two or more norm children and one attention child (kinds the other
watches measured). One more run of the first forward records, for each candidate's first call,
its input and output and each child's (and each child of its attention module's) input, output
and call order, and the tables its call carried. The composition is `pre_norm_residual` when the
call is h = x + attn(n1(x)), y = h + ffn(n2(h)) exactly, element for element (fp32 adds are
exact to repeat); anything else is `other`, with the first identity that failed. Inside the
attention module the q, k, v projections are the three that read its input, in call order, o the
one that does not, and a per-head norm is q's or k's by the projection output it read. Nothing is
matched on a class or attribute name; the block seat's first decode call is then checked against
the host's layer on live values (block_seats.py), which catches what identities cannot (a role
read in another order).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import _core
from .calls import Forward, host_call


def _tensor_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    x = args[0] if args else kwargs.get("hidden_states")
    return x if isinstance(x, torch.Tensor) else None


def _tensor_out(out: Any) -> torch.Tensor | None:
    if isinstance(out, tuple) and out:
        out = out[0]
    return out if isinstance(out, torch.Tensor) else None


@dataclass
class _Call:
    """A module's first call in the probe run: its input, output and call order."""

    order: int
    x: torch.Tensor | None = None
    y: torch.Tensor | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is not None and b is not None and a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(a, b))


def _same_values(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Equal element for element, whatever the view (a per-head norm reads a reshaped output)."""
    return (a is not None and b is not None and a.numel() == b.numel() and a.dtype == b.dtype
            and torch.equal(a.reshape(-1), b.reshape(-1)))


class BlockWatch:
    """The probe run's hooks on the candidate layers, their children and their attention's."""

    def __init__(self, model: nn.Module, graph: _core.HostGraph) -> None:
        self.model = model
        self.graph = graph
        kinds = {m.path: m.kind for m in graph.modules}
        K = _core.ModuleKind
        # A decoder layer's attention reads a cache of keys and values; a module attending whole
        # sequences (a DiT's, cache none) makes its layer no decoder layer.
        self.cached = {m.path for m in graph.modules
                       if m.kind == K.attention and m.attention.cache != _core.AttentionCache.none}
        self.candidates: dict[str, list[str]] = {}  # layer -> its direct children's paths
        for m in graph.modules:
            if m.kind != K.module:
                continue
            children = list(m.children)
            norms = [c for c in children if kinds.get(c) == K.norm]
            attention = [c for c in children if c in self.cached]
            if len(norms) >= 2 and len(attention) == 1:
                self.candidates[m.path] = children
        self.rotary = [m.path for m in graph.modules if m.kind == K.rotary]
        self.calls: dict[str, _Call] = {}
        self._order = 0

    def _pre(self, path: str, module: nn.Module, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> None:
        if path not in self.calls:
            self.calls[path] = _Call(self._order, _tensor_in(args, kwargs), kwargs=dict(kwargs))
            self._order += 1

    def _post(self, path: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
              out: Any) -> None:
        call = self.calls.get(path)
        if call is not None and call.y is None:
            if path in self.rotary and isinstance(out, tuple):
                call.kwargs = {"outputs": out}
            if path in self.candidates and not isinstance(out, torch.Tensor):
                call.kwargs["returned"] = type(out).__name__  # the block returns a tensor
            call.y = _tensor_out(out)

    def run(self, forward: Forward) -> None:
        if not self.candidates:
            return
        by_path = dict(self.model.named_modules())
        watched = set(self.candidates) | set(self.rotary)
        for children in self.candidates.values():
            watched.update(children)
            for c in children:
                if c in self.cached:
                    watched.update(f"{c}.{n}" for n, _ in by_path[c].named_children())
        handles = []
        try:
            for p in watched:
                mod = by_path[p]
                handles.append(mod.register_forward_pre_hook(
                    functools.partial(self._pre, p), with_kwargs=True))
                handles.append(mod.register_forward_hook(
                    functools.partial(self._post, p), with_kwargs=True))
            with torch.no_grad():
                forward()
        finally:
            for h in handles:
                h.remove()

    def write(self) -> None:
        """Each candidate that was called becomes a block node with what its call showed."""
        kinds = {m.path: m.kind for m in self.graph.modules}
        modules = list(self.graph.modules)
        calls = list(self.graph.calls)
        for hm in modules:
            children = self.candidates.get(hm.path)
            call = self.calls.get(hm.path)
            if children is None or call is None or call.x is None or call.y is None:
                continue
            hm.kind = _core.ModuleKind.block
            hm.block = self._facts(hm.path, call, children, kinds)
            c = host_call(hm.path, call.x, call.y)
            c.input_id = c.output_id = 0  # the probe's tensors are gone: no identities
            calls.append(c)
        self.graph.modules = modules
        self.graph.calls = calls
        self.calls.clear()

    def _facts(self, path: str, call: _Call, children: list[str],
               kinds: dict[str, Any]) -> _core.BlockFacts:
        K = _core.ModuleKind
        f = _core.BlockFacts()
        x, y = call.x, call.y
        assert x is not None and y is not None
        f.hidden = int(x.shape[-1])
        seen = sorted((c for c in children if c in self.calls), key=lambda c: self.calls[c].order)
        norms = [c for c in seen if kinds.get(c) == K.norm]
        attention = next(c for c in children if c in self.cached)
        rest = [c for c in seen if kinds.get(c) != K.norm and c != attention]

        def other(why: str) -> _core.BlockFacts:
            f.form = _core.BlockForm.other
            f.other = why
            return f

        if "returned" in call.kwargs:
            return other(f"its call returns a {call.kwargs['returned']}, not the hidden states")
        if len(norms) != 2:
            return other(f"{len(norms)} norms called ({', '.join(norms)}); the form has one "
                         "before the attention and one before the feed-forward")
        if len(rest) != 1:
            return other(f"{len(rest)} sublayers beside the norms and the attention "
                         f"({', '.join(rest) or 'none'}); the form has one feed-forward")
        n1, n2 = (self.calls[n] for n in norms)
        a, ffn = self.calls.get(attention), self.calls[rest[0]]
        if a is None:
            return other(f"{attention} was not called")
        checks: list[tuple[bool, str]] = [
            (_same(n1.x, x), f"{norms[0]} does not read the layer's input"),
            (_same(a.x, n1.y), f"{attention} does not read {norms[0]}'s output"),
            (n1.order < a.order < n2.order < ffn.order,
             "the norms, attention and feed-forward are not called in that order"),
        ]
        for ok, why in checks:
            if not ok:
                return other(why)
        h = x + a.y if a.y is not None and a.y.shape == x.shape else None
        if not _same(n2.x, h):
            return other(f"{norms[1]} does not read x + {attention}'s output (a scaled residual, "
                         "or a norm after the attention)")
        if not _same(ffn.x, n2.y):
            return other(f"{rest[0]} does not read {norms[1]}'s output")
        out = (n2.x + ffn.y if n2.x is not None and ffn.y is not None and ffn.y.shape == y.shape
               else None)
        if not _same(y, out):
            return other(f"the layer's output is not h + {rest[0]}'s output (a scaled residual, "
                         "or a norm after the feed-forward)")
        f.input_norm, f.post_norm, f.attention, f.ffn = norms[0], norms[1], attention, rest[0]
        why = self._attention_parts(f, attention, a, kinds)
        if why:
            return other(why)
        f.rotary = self._rotary_of(call)
        if not f.rotary:
            return other("its call carries no tables a rotary module returned")
        f.form = _core.BlockForm.pre_norm_residual
        return f

    def _attention_parts(self, f: _core.BlockFacts, attention: str, a: _Call,
                         kinds: dict[str, Any]) -> str:
        K = _core.ModuleKind
        inner = sorted((p for p in self.calls if p.startswith(attention + ".")
                        and "." not in p[len(attention) + 1:]),
                       key=lambda p: self.calls[p].order)
        linears = [p for p in inner if kinds.get(p) == K.linear]
        reading = [p for p in linears if _same(self.calls[p].x, a.x)]
        others = [p for p in linears if p not in reading]
        if len(reading) != 3:
            return (f"{len(reading)} projections of {attention} read its input "
                    f"({', '.join(reading) or 'none'}); the form has q, k and v")
        if len(others) != 1:
            return (f"{len(others)} projections of {attention} read something else "
                    f"({', '.join(others) or 'none'}); the form has one output projection")
        f.q, f.k, f.v = reading
        f.o = others[0]
        for p in inner:
            if kinds.get(p) != K.norm:
                continue
            if _same_values(self.calls[p].x, self.calls[f.q].y) and not f.q_norm:
                f.q_norm = p
            elif _same_values(self.calls[p].x, self.calls[f.k].y) and not f.k_norm:
                f.k_norm = p
            else:
                return f"{p} reads neither q's nor k's projection"
        if bool(f.q_norm) != bool(f.k_norm):
            return "a per-head norm on one of q and k only"
        return ""

    def _rotary_of(self, call: _Call) -> str:
        tables = call.kwargs.get("position_embeddings")
        if not isinstance(tables, tuple) or not tables:
            return ""
        for p in self.rotary:
            out = self.calls.get(p)
            returned = out.kwargs.get("outputs") if out is not None else None
            if isinstance(returned, tuple) and returned and returned[0] is tables[0]:
                return p
        return ""


def watch_blocks(model: nn.Module, graph: _core.HostGraph, forward: Forward) -> None:
    """Measures the candidate layers on one more run of `forward` and writes their facts."""
    watch = BlockWatch(model, graph)
    watch.run(forward)
    watch.write()

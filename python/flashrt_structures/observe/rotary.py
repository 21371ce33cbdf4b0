"""Rotary seams: the rotary function attention modules call with their model's cos and sin.

transformers' attention modules rotate q and k with a function of their modeling file,
`apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`, handed the tables the model's rotary
module returned for those positions. A function is recognised by its signature (q, k, cos, sin),
never by its name, and what it computes is measured: called on inputs of our own and compared in
float64 with the two pairings (element i with i + head_dim/2, or neighbours 2i and 2i + 1). Its
calls are attributed to the rotary module whose tables they carry (the very tensors the module
returned, Note [Whose tables are they]) and recorded while the observed forward runs
(`RotaryWatch`): the rotary module becomes a rotary node with the q and k heads and the head size
the calls showed.

Note [Whose tables are they]: a rotary function is not passed the module that computed its cos
and sin, but the tensors themselves: the watch (and the seat) hold what the rotary module's
forward returned lately (the seat its last few cos tables, so their memory cannot be handed to
another tensor meanwhile), and a call whose cos is that storage carries its tables. Whoever else
calls the function with the same tables asks for the same computation, so claiming it computes
what the host would.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import _core
from .calls import host_call
from .functions import Function, called_functions, relative_error, wrapping


def rotary_functions(model: nn.Module) -> list[Function]:
    """The rotary functions the forwards of the model's modules name (one per namespace and
    name)."""
    found: dict[str, Function] = {}
    for mod in model.modules():
        for f in called_functions(mod):
            if f.kind == "rotary":
                found.setdefault(f.qualname, f)
    return list(found.values())


def tables_of(output: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A rotary module's (cos, sin), if that is what its forward returned."""
    if (isinstance(output, tuple) and len(output) == 2
            and all(isinstance(t, torch.Tensor) for t in output)):
        return output[0], output[1]
    return None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    return torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)


# What each function measured as, by the function object (weakly).
_MEASURED: weakref.WeakKeyDictionary[Callable[..., Any], tuple[_core.RotaryForm, str]] = (
    weakref.WeakKeyDictionary())


def measure_rotary(fn: Callable[..., Any]) -> tuple[_core.RotaryForm, str]:
    """What a rotary function computes on q [2, 3, 5, 8], k [2, 1, 5, 8] and tables of the
    pairing under test [2, 5, 8]: half, interleaved, or other with what differed. Cached per
    function object."""
    if fn in _MEASURED:
        return _MEASURED[fn]
    gen = torch.Generator().manual_seed(13)
    q = torch.randn(2, 3, 5, 8, generator=gen)
    k = torch.randn(2, 1, 5, 8, generator=gen)
    angles = torch.rand(2, 5, 4, generator=gen) * 6.0
    result = (_core.RotaryForm.other, "")
    errors = []
    for form, table, rotate in (
            (_core.RotaryForm.half, lambda a: torch.cat([a, a], -1), _rotate_half),
            (_core.RotaryForm.interleaved, lambda a: a.repeat_interleave(2, -1), _rotate_pairs)):
        cos, sin = table(angles).cos(), table(angles).sin()
        try:
            with torch.no_grad():
                got = fn(q, k, cos, sin)
        except Exception as e:  # noqa: BLE001 - a function that cannot take the probe is not one
            result = (_core.RotaryForm.other, f"its call on a probe raised {type(e).__name__}")
            break
        if not (isinstance(got, tuple) and len(got) == 2
                and all(isinstance(t, torch.Tensor) for t in got)):
            result = (_core.RotaryForm.other, "it does not return (q, k)")
            break
        c, s = cos.double()[:, None], sin.double()[:, None]
        err = 0.0
        for x, y in zip((q, k), got, strict=True):
            want = x.double() * c + rotate(x.double()) * s
            if y.shape != want.shape:
                err = float("inf")
                break
            err = max(err, relative_error(y, want))
        if err <= 1e-5:
            result = (form, "")
            break
        errors.append(f"{err:.2g} from {form.name}")
    if result[0] == _core.RotaryForm.other and not result[1]:
        result = (result[0], "it differs from both pairings on a probe (" + ", ".join(errors) + ")")
    _MEASURED[fn] = result
    return result


@dataclass
class _Seen:
    """What the calls carrying one rotary module's tables showed."""

    dims: set[tuple[int, int, int, int]] = field(default_factory=set)  # heads, kv, dim, table
    layouts: set[int] = field(default_factory=set)  # unsqueeze_dim
    other: set[str] = field(default_factory=set)
    functions: set[str] = field(default_factory=set)
    tables: list[torch.Tensor] = field(default_factory=list)  # each call's cos [batch, tokens, d]


class RotaryWatch:
    """The observed forward with every rotary function the model's modules name wrapped: each
    call attributed to the rotary module whose tables it carries and recorded."""

    def __init__(self, model: nn.Module, graph: _core.HostGraph) -> None:
        self.model = model
        self.graph = graph
        by_path = dict(model.named_modules())
        self.rotaries = {m.path: by_path[m.path] for m in graph.modules
                         if m.path in by_path and (m.rotary.inv_freq or m.rotary.inv_freq_of)}
        self.functions = {f.qualname: f for f in rotary_functions(model)} if self.rotaries else {}
        self.tables: dict[int, str] = {}  # storage of a cos a rotary module returned -> its path
        self.kept: list[Any] = []  # those outputs, alive until observation ends (no reused ptr)
        self.seen: dict[str, _Seen] = {}

    def _returned(self, path: str, output: Any) -> None:
        tables = tables_of(output)
        if tables is not None:
            self.tables[tables[0].data_ptr()] = path
            self.kept.append(tables)

    def _record(self, fn: Function, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            bound = inspect.signature(fn.original()).bind(*args, **kwargs)
        except TypeError:
            return
        bound.apply_defaults()
        q, k, cos = (bound.arguments.get(n) for n in ("q", "k", "cos"))
        if not isinstance(cos, torch.Tensor) or cos.data_ptr() not in self.tables:
            return
        seen = self.seen.setdefault(self.tables[cos.data_ptr()], _Seen())
        seen.functions.add(fn.qualname)
        seen.layouts.add(int(bound.arguments.get("unsqueeze_dim", 1) or 0))
        if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == 4
                and k.dim() == 4 and cos.dim() == 3):
            seen.other.add("its calls' q, k are not [batch, heads, tokens, dim] with a [batch, "
                           "tokens, dim] table")
            return
        seen.dims.add((q.shape[1], k.shape[1], q.shape[3], cos.shape[-1]))
        seen.tables.append(cos)

    @contextmanager
    def watching(self) -> Iterator[None]:
        handles = [mod.register_forward_hook(
            lambda _m, _a, out, path=path: self._returned(path, out))
            for path, mod in self.rotaries.items()]
        try:
            with wrapping(self.functions.values(), self._record):
                yield
        finally:
            for h in handles:
                h.remove()

    def write(self) -> None:
        """Each rotary module whose tables a rotary function was called with becomes a rotary
        node, those calls its HostCalls (rows = batch x tokens, width = the table's)."""
        modules = list(self.graph.modules)
        calls = list(self.graph.calls)
        for hm in modules:
            seen = self.seen.get(hm.path)
            if seen is None:
                continue
            hm.kind = _core.ModuleKind.rotary
            facts = hm.rotary
            facts.functions = sorted(seen.functions)
            facts.form = _core.RotaryForm.half
            why = sorted(seen.other)
            for name in facts.functions:
                form, what = measure_rotary(self.functions[name].original())
                if form != _core.RotaryForm.half:
                    facts.form = form
                    if what:
                        why.append(f"{name.rpartition('.')[2]}: {what}")
            if len(seen.dims) == 1:
                facts.heads, facts.kv_heads, facts.head_dim, width = next(iter(seen.dims))
                if width != facts.head_dim:
                    why.append(f"its calls' tables are {width} wide for heads of "
                               f"{facts.head_dim} (a partial rotary)")
            elif len(seen.dims) > 1:
                why.append(f"its calls had several shapes {sorted(seen.dims)}")
            if seen.layouts != {1}:
                why.append(f"its calls pass unsqueeze_dim {sorted(seen.layouts)} (the op reads "
                           "[batch, heads, tokens, dim] with 1)")
            if why:
                if facts.form == _core.RotaryForm.half:
                    facts.form = _core.RotaryForm.other
                facts.other = "; ".join(why)
            hm.rotary = facts
            for cos in seen.tables:  # alive in `seen`: their ids are not reused
                calls.append(host_call(hm.path, cos, cos))
        self.graph.modules = modules
        self.graph.calls = calls

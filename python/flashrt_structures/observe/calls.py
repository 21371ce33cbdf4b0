"""Call recording: what one real forward showed (rows per call, dtypes, which calls shared a
tensor, call order), and what the hooked modules' calls measured (a wrapper's activation, a norm
without affine and where its output is modulated).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from .. import _core
from .experts import describe_bank, measure_bank
from .probes import (
    bare_leaf,
    dtype_of,
    fit_modulation,
    measure_activation,
    measure_bare_norm,
    measure_wrapped,
    wrapped_linear,
)

Forward = Callable[[], object]


def normalise_forwards(forward: Forward | Iterable[Forward]) -> list[Forward]:
    """One zero-argument callable, or a list of them (one per sample)."""
    if callable(forward):
        return [forward]
    thunks = list(forward)
    if not thunks or not all(callable(f) for f in thunks):
        raise ValueError("forward must be a zero-argument callable or a non-empty list of them")
    return thunks


def _rows(t: torch.Tensor) -> int:
    return math.prod(t.shape[:-1]) if t.dim() >= 1 else 1


def _first_tensor(out: object) -> object:
    """An engine's projection returns (output, bias): the output is its first element."""
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return out


def _sources(model: nn.Module, path: str) -> str:
    """What a module's own forward can compute a modulation from: its own parameters and its
    direct Linear children, with their shapes; else its arguments."""
    mod = model.get_submodule(path) if path else model
    items = [f"{name} {list(p.shape)}" for name, p in mod.named_parameters(recurse=False)]
    items += [f"{path + '.' if path else ''}{name} [{c.out_features}x{c.in_features}]"
              for name, c in mod.named_children() if isinstance(c, nn.Linear)]
    return ", ".join(items) if items else "its forward's arguments"


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


class CallRecorder:
    """The forward hooks of one observation and what they saw.

    `run(forwards)` hooks the modules `describe_tree` chose (`on_call`) and, with `model`, the
    modules holding a norm without affine (`on_parent_return`: where a norm's output is
    modulated is named from what they return); `write(graph)` then records the calls and the
    kinds the calls showed on the graph."""

    def __init__(self, hooked: list[tuple[str, nn.Module]], model: nn.Module | None = None) -> None:
        self.hooked = hooked
        self.model = model
        self.calls: list[_core.HostCall] = []
        # Norms without affine (parameter-free modules measured on their calls) and the
        # modulation of their outputs: which projection inputs are n*scale + shift of a norm's
        # output n.
        self.bare = {path for path, mod in hooked
                     if bare_leaf(mod) and measure_activation(mod) is None}
        self.norms: dict[str, _core.NormForm | None] = {}  # bare path -> form (None: calls differ)
        self.where: dict[str, str] = {}  # norm path -> where its output was modulated
        # wrapper path -> the activation its calls showed (None: none, or calls differ)
        self.wrapped: dict[str, _core.Activation | None] = {}
        self._keep: list[torch.Tensor] = []  # every observed tensor, so no id is reused meanwhile
        self._last_out: dict[int, torch.Tensor] = {}  # id(module) -> its latest output
        self._norm_outs: list[tuple[str, torch.Tensor]] = []  # recent norm outputs, newest last
        self._modulated: dict[int, tuple[int, str] | None] = {}  # id(x) -> (id(n), norm path)
        self._returned: dict[int, tuple[str, int]] = {}  # id(first output) -> (path, outputs)
        # bank path -> (its facts, the activation its calls showed (unknown: none reproduced
        # them, or calls differ), the top-k they carried)
        self.banks: dict[str, tuple[_core.ExpertFacts, _core.Activation | None, int]] = {}
        for path, mod in hooked:
            if (facts := describe_bank(mod)) is not None:
                self.banks[path] = (facts, None, 0)

    def run(self, forwards: list[Forward]) -> None:
        """Runs the forwards with the hooks in place; after, the hooks are removed and the
        observed tensors released (the recorded ids are not looked up again)."""
        parents = {path.rpartition(".")[0] for path in self.bare}
        by_path = dict(self.model.named_modules()) if self.model is not None else {}
        handles = [mod.register_forward_hook(functools.partial(self.on_call, path))
                   for path, mod in self.hooked]
        handles += [by_path[p].register_forward_hook(functools.partial(self.on_parent_return, p))
                    for p in parents if p in by_path]
        try:
            with torch.no_grad():
                for fwd in forwards:
                    fwd()
        finally:
            self._keep.clear()
            self._last_out.clear()
            self._norm_outs.clear()
            for h in handles:
                h.remove()

    def on_parent_return(self, path: str, mod: nn.Module, args: tuple[Any, ...],
                         output: Any) -> None:
        """A norm's parent returned: remember which module returned which tensor, and how many."""
        first = _first_tensor(output)
        if isinstance(first, torch.Tensor):
            self._keep.append(first)
            self._returned[id(first)] = (path, len(output) if isinstance(output, tuple) else 1)

    def on_call(self, path: str, mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """A hooked module's call: recorded as a HostCall when its input and output are tensors."""
        if path in self.bare:
            self._on_bare_call(path, mod, args, output)
            return
        if path in self.banks:
            self._on_bank_call(path, mod, args, output)
            return
        output = _first_tensor(output)
        if (not args or not isinstance(args[0], torch.Tensor)
                or not isinstance(output, torch.Tensor)):
            return
        x = args[0]
        self._last_out[id(mod)] = output
        inner_mod = None if isinstance(mod, nn.Linear) else wrapped_linear(mod)
        if inner_mod is not None:
            # A projection-then-activation module: the activation node reads the Linear's
            # output, so its call is recorded with that tensor as input.
            inner = self._last_out.get(id(inner_mod))
            act = None if inner is None else measure_wrapped(inner, output)
            self.wrapped[path] = act if self.wrapped.get(path, act) == act else None
            if act is None or inner is None:
                return
            x = inner
        self._keep.extend((x, output))
        call = host_call(path, x, output)
        if self._norm_outs and (mod_of := self._modulation_of(x)) is not None:
            call.modulated_from = mod_of[0]
        self.calls.append(call)

    def _on_bank_call(self, path: str, mod: nn.Module, args: tuple[Any, ...],
                      output: Any) -> None:
        """A bank's call: recorded with its hidden rows; its gated form measured on the first
        call (a later call that measures differently makes it unknown)."""
        facts, act, top_k = self.banks[path]
        if not args or not isinstance(args[0], torch.Tensor) or not isinstance(output,
                                                                                 torch.Tensor):
            return
        if len(args) >= 2 and isinstance(args[1], torch.Tensor) and args[1].dim() == 2:
            top_k = max(top_k, int(args[1].shape[1]))
        if act is None:
            act = measure_bank(mod, facts, args, output)
        self.banks[path] = (facts, act, top_k)
        self._keep.extend((args[0], output))
        self.calls.append(host_call(path, args[0], output))

    def _on_bare_call(self, path: str, mod: nn.Module, args: tuple[Any, ...],
                      output: Any) -> None:
        """A parameter-free leaf's call: a norm when every call measures as the same form."""
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or not isinstance(output, torch.Tensor):
            return
        form = measure_bare_norm(x, output, float(getattr(mod, "eps", 1e-6)))
        self.norms[path] = form if self.norms.get(path, form) == form else None
        if form is not None:
            self._keep.extend((x, output))
            self._norm_outs.append((path, output))
            self.calls.append(host_call(path, x, output))

    def _modulation_of(self, x: torch.Tensor) -> tuple[int, str] | None:
        """(id of the norm output x is modulated from, that norm's path), from the last four
        norm outputs; the first time a norm's output is found modulated, where is named."""
        if id(x) in self._modulated:
            return self._modulated[id(x)]
        found = None
        for npath, n in reversed(self._norm_outs[-4:]):
            if n.shape == x.shape and fit_modulation(n, x):
                found = (id(n), npath)
                owner = npath.rpartition(".")[0]
                if npath not in self.where:
                    ret = self._returned.get(id(x))
                    tail = ""
                    if ret is not None and ret[0] == owner:
                        tail = (f", which returns it with {ret[1] - 1} more tensors" if ret[1] > 1
                                else ", which returns it")
                    sources = _sources(self.model, owner) if self.model is not None else "?"
                    self.where[npath] = f"in {owner or '(root)'}.forward from {sources}{tail}"
                break
        self._modulated[id(x)] = found
        return found

    def write(self, graph: _core.HostGraph) -> None:
        """Appends the recorded calls to graph.calls; a wrapper whose calls showed an activation
        becomes an activation node, a bare leaf whose calls showed a norm a norm node; a bank
        takes the activation and top-k its calls showed."""
        if self.banks:
            modules = list(graph.modules)
            for hm in modules:
                if hm.path in self.banks:
                    _, act, top_k = self.banks[hm.path]
                    facts = hm.experts
                    facts.top_k = top_k
                    hm.experts = facts
                    hm.activation = act if act is not None else _core.Activation.unknown
            graph.modules = modules
        if any(act is not None for act in self.wrapped.values()) or any(self.norms.values()):
            modules = list(graph.modules)
            for hm in modules:
                if (wrapped_act := self.wrapped.get(hm.path)) is not None:
                    hm.kind = _core.ModuleKind.activation
                    hm.activation = wrapped_act
                if (norm_form := self.norms.get(hm.path)) is not None:
                    hm.kind = _core.ModuleKind.norm
                    hm.norm = _core.NormFacts(norm_form, 0.0, False, self.where.get(hm.path, ""))
            graph.modules = modules
        graph.calls = list(graph.calls) + self.calls


def record_calls(graph: _core.HostGraph, hooked: list[tuple[str, nn.Module]],
                 forwards: list[Forward], model: nn.Module | None = None) -> None:
    """Runs the forwards with the hooked modules observed; sets graph.calls. With `model`, where
    a norm's output is modulated is located too (the modules that hold the norms are observed)."""
    recorder = CallRecorder(hooked, model)
    recorder.run(forwards)
    recorder.write(graph)

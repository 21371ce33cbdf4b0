"""Function seams: modules whose forward calls a recurrence or a convolution function of their
own modeling namespace (transformers' linear-attention modules call the gated delta rule and a
causal convolution as module-level functions, so a kernel package can replace them).

A function is recognised by its signature, never by its name: a rule takes (query, key, value,
g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel), a convolution
(hidden_states, weight, bias, activation) and its update form a conv_state besides. What it
computes is then measured: it is called on inputs of our own and compared with the recurrence
in float64 (`RecurrenceForm.gated_delta`), or with the causal convolution. The module's calls of
it are recorded while the observed forward runs (`FunctionWatch`): the shapes its operands had
and the flags it was passed.
"""

from __future__ import annotations

import inspect
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import _core
from .calls import host_call

RULE_PARAMS = frozenset({"query", "key", "value", "g", "beta", "initial_state",
                         "output_final_state", "use_qk_l2norm_in_kernel"})
CONV_PARAMS = frozenset({"hidden_states", "weight", "bias", "activation"})
ROTARY_PARAMS = frozenset({"q", "k", "cos", "sin"})
# The activation names a convolution call may pass that the op applies (None: no activation).
CONV_ACTIVATIONS = {"silu": _core.Activation.silu, "swish": _core.Activation.silu}


@dataclass(frozen=True)
class Function:
    """A function of a modeling namespace a module's forward calls."""

    namespace: dict[str, Any] = field(repr=False, compare=False, hash=False)
    module_name: str  # the namespace's module (`transformers.models.qwen3_next.modeling_...`)
    name: str
    kind: str  # "rule", "conv", "conv_update" or "rotary"

    @property
    def qualname(self) -> str:
        return f"{self.module_name}.{self.name}"

    @property
    def is_conv(self) -> bool:
        """A convolution function, either form (the prompt's or the one-token update)."""
        return self.kind in ("conv", "conv_update")

    def current(self) -> Callable[..., Any]:
        return self.namespace[self.name]

    def original(self) -> Callable[..., Any]:
        """The host's own function, under whatever wrapper (a watch, a seat's dispatch) stands."""
        fn = self.current()
        while hasattr(fn, "_flashrt_original"):
            fn = fn._flashrt_original
        return fn


def _params(fn: object) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(fn).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return frozenset()


def _kind_of(fn: object) -> str | None:
    params = _params(fn)
    if RULE_PARAMS <= params:
        return "rule"
    if CONV_PARAMS <= params:
        return "conv_update" if "conv_state" in params else "conv"
    if ROTARY_PARAMS <= params:
        return "rotary"  # observe/rotary.py
    return None


def called_functions(mod: nn.Module) -> list[Function]:
    """The rule and convolution functions of the module's namespace its forward names (per
    class: a Function resolves the namespace's current object when used)."""
    cls = type(mod)
    if cls not in _CALLED:
        _CALLED[cls] = _functions_of(cls)
    return _CALLED[cls]


_CALLED: dict[type, list[Function]] = {}


def _functions_of(cls: type) -> list[Function]:
    module_name = cls.__module__
    namespace = getattr(sys.modules.get(module_name), "__dict__", None)
    forward = inspect.unwrap(getattr(cls, "forward", None) or (lambda: None))
    code = getattr(forward, "__code__", None)
    if namespace is None or code is None:
        return []
    out = []
    for name in code.co_names:
        fn = namespace.get(name)
        if fn is None or not callable(fn):
            continue
        while hasattr(fn, "_flashrt_original"):  # a seat's dispatch stands there
            fn = fn._flashrt_original
        if (kind := _kind_of(fn)) is not None:
            out.append(Function(namespace, module_name, name, kind))
    return out


def _reference_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                    beta: torch.Tensor, state: torch.Tensor | None,
                    l2norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule in float64 (frt_gated_delta_args): per value head and token,
    S <- exp(g) S; d = beta (v - S^T k); S <- S + k d^T; o = S^T q."""
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    b, t_len, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    rep = hv // hk
    q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * dk ** -0.5
    s = (torch.zeros(b, hv, dk, dv, dtype=torch.float64) if state is None
         else state.double().clone())
    out = torch.zeros(b, t_len, hv, dv, dtype=torch.float64)
    for t in range(t_len):
        s = s * g[:, t].exp()[..., None, None]
        kv = (s * k[:, t, :, :, None]).sum(-2)
        d = (v[:, t] - kv) * beta[:, t, :, None]
        s = s + k[:, t, :, :, None] * d[:, :, None, :]
        out[:, t] = (s * q[:, t, :, :, None]).sum(-2)
    return out, s


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest absolute difference over the largest magnitude of `want` (float64)."""
    return float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30))


# What each function measured as, by the function object (weakly: a dropped one is not kept).
_MEASURED: weakref.WeakKeyDictionary[Callable[..., Any], tuple[_core.RecurrenceForm, str]] = (
    weakref.WeakKeyDictionary())


def measure_rule(fn: Callable[..., Any]) -> tuple[_core.RecurrenceForm, str]:
    """What a rule function computes, called on inputs of our own (grouped heads, an initial
    state, an odd length, both l2norm flags) against the float64 recurrence: gated_delta, or
    other with what differed. Cached per function object."""
    if fn in _MEASURED:
        return _MEASURED[fn]
    gen = torch.Generator().manual_seed(7)
    b, t_len, hk, hv, dk, dv = 1, 5, 2, 4, 8, 6
    q = torch.randn(b, t_len, hk, dk, generator=gen)
    k = torch.randn(b, t_len, hk, dk, generator=gen)
    v = torch.randn(b, t_len, hv, dv, generator=gen)
    g = -torch.rand(b, t_len, hv, generator=gen)
    beta = torch.rand(b, t_len, hv, generator=gen)
    state = torch.randn(b, hv, dk, dv, generator=gen) * 0.1
    result = (_core.RecurrenceForm.gated_delta, "")
    for l2norm in (True, False):
        try:
            with torch.no_grad():
                out, final = fn(q, k, v, g=g, beta=beta, initial_state=state.clone(),
                                output_final_state=True, use_qk_l2norm_in_kernel=l2norm)
        except Exception as e:  # noqa: BLE001 - a function that cannot take the probe is not one
            result = (_core.RecurrenceForm.other, f"its call on a probe raised {type(e).__name__}")
            break
        want_out, want_state = _reference_rule(q, k, v, g, beta, state, l2norm)
        if (not isinstance(out, torch.Tensor) or out.shape != want_out.shape
                or not isinstance(final, torch.Tensor) or final.shape != want_state.shape):
            result = (_core.RecurrenceForm.other, "its output or state has another shape than "
                      "the gated delta rule's")
            break
        err = max(relative_error(out, want_out), relative_error(final, want_state))
        if err > 1e-4:
            result = (_core.RecurrenceForm.other, f"it differs from the gated delta rule by "
                      f"{err:.2g} (relative) on a probe")
            break
    _MEASURED[fn] = result
    return result


def _reference_conv(x: torch.Tensor, w: torch.Tensor, state: torch.Tensor | None,
                    silu: bool, bias: torch.Tensor | None = None) -> torch.Tensor:
    taps = w.shape[1]
    pad = (torch.zeros(x.shape[0], x.shape[1], taps - 1, dtype=torch.float64) if state is None
           else state.double())
    full = torch.cat([pad, x.double()], dim=-1)
    y = torch.nn.functional.conv1d(full, w.double()[:, None],
                                   None if bias is None else bias.double(), groups=x.shape[1])
    y = y[..., -x.shape[-1]:]
    return torch.nn.functional.silu(y) if silu else y


_CONV_MEASURED: weakref.WeakKeyDictionary[Callable[..., Any], bool] = weakref.WeakKeyDictionary()


def measure_conv(fn: Callable[..., Any], kind: str) -> bool:
    """Whether a convolution function computes the causal depthwise convolution (its update
    form: with the state before x, left updated), on inputs of our own: both activations, with
    and without a bias."""
    if fn in _CONV_MEASURED:
        return _CONV_MEASURED[fn]
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(2, 3, 1 if kind == "conv_update" else 5, generator=gen)
    w = torch.randn(3, 4, generator=gen)
    ok = True
    for act, bias in (("silu", None), (None, None), ("silu", torch.randn(3, generator=gen))):
        state = torch.randn(2, 3, 4, generator=gen)
        try:
            with torch.no_grad():
                if kind == "conv_update":
                    before = state.clone()
                    y = fn(x, state, w, bias, act)
                    want = _reference_conv(x, w, before[..., 1:], act is not None, bias)
                    shifted = torch.cat([before, x], -1)[..., -4:].double()
                    ok &= relative_error(state, shifted) < 1e-6
                else:
                    y = fn(x, w, bias, activation=act)
                    want = _reference_conv(x, w, None, act is not None, bias)
        except Exception:  # noqa: BLE001 - not a convolution of this form
            ok = False
            break
        ok &= (isinstance(y, torch.Tensor) and y.shape == want.shape
               and relative_error(y, want) < 1e-5)
    _CONV_MEASURED[fn] = ok
    return ok


def describe_recurrence(mod: nn.Module) -> _core.RecurrenceFacts | None:
    """A module whose forward calls a rule function: its measured form (dims come from its
    calls, `FunctionWatch`). None when its forward calls none."""
    rules = [f for f in called_functions(mod) if f.kind == "rule"]
    if not rules:
        return None
    facts = _core.RecurrenceFacts()
    facts.functions = [f.qualname for f in rules]
    facts.form = _core.RecurrenceForm.gated_delta
    for f in rules:
        form, why = measure_rule(f.original())
        if form != _core.RecurrenceForm.gated_delta:
            facts.form, facts.other = form, f"{f.name}: {why}"
            break
    return facts


def describe_conv(mod: nn.Module) -> _core.ConvFacts | None:
    """A 1-D convolution module, as a convolution function would be handed its weight."""
    if not isinstance(mod, nn.Conv1d):
        return None
    facts = _core.ConvFacts()
    facts.channels = mod.in_channels
    facts.taps = mod.kernel_size[0]
    facts.groups = mod.groups
    padding = mod.padding[0] if isinstance(mod.padding, tuple) else 0
    facts.padding = int(padding)
    facts.has_bias = mod.bias is not None
    return facts


# Note [Whose call is it]: a rule function is not passed its module, so the door keeps, per
# thread, the stack of modules whose forward is running (pushed by a forward pre-hook, popped by
# a forward hook that also runs on an exception): the innermost one that calls the function is
# the caller. A convolution function is handed the module's own weight (a view of it), so its
# caller is found by the weight's storage.
_STACK = threading.local()


def running_modules() -> list[nn.Module]:
    stack: list[nn.Module] | None = getattr(_STACK, "modules", None)
    if stack is None:
        stack = _STACK.modules = []
    return stack


def push_hooks(mod: nn.Module) -> list[Any]:
    """Hooks that keep `mod` on the running stack while its forward runs."""
    def pre(m: nn.Module, _args: Any) -> None:
        running_modules().append(m)

    def post(m: nn.Module, _args: Any, _out: Any) -> None:
        stack = running_modules()
        if stack and stack[-1] is m:
            stack.pop()

    return [mod.register_forward_pre_hook(pre),
            mod.register_forward_hook(post, always_call=True)]


Record = Callable[[Function, tuple[Any, ...], dict[str, Any]], None]


@contextmanager
def wrapping(functions: Iterable[Function], record: Record) -> Iterator[None]:
    """Each function wrapped where its namespace holds it, so `record` sees every call before
    the function runs; the very objects that stood there are back on exit."""
    installed: list[tuple[Function, Callable[..., Any]]] = []

    def wrap(fn: Function, original: Callable[..., Any]) -> Callable[..., Any]:
        def watched(*args: Any, **kwargs: Any) -> Any:
            record(fn, args, kwargs)
            return original(*args, **kwargs)
        watched._flashrt_original = original  # type: ignore[attr-defined]
        return watched

    try:
        for fn in functions:
            original = fn.current()
            fn.namespace[fn.name] = wrap(fn, original)
            installed.append((fn, original))
        yield
    finally:
        for fn, original in installed:
            fn.namespace[fn.name] = original


@contextmanager
def watched_calls(modules: Iterable[nn.Module], functions: Iterable[Function],
                  record: Record) -> Iterator[None]:
    """`modules` on the running stack while their forwards run and `functions` wrapped, so
    `record` can give each call to its module (Note [Whose call is it]); all undone on exit."""
    handles = [h for mod in modules for h in push_hooks(mod)]
    try:
        with wrapping(functions, record):
            yield
    finally:
        for h in handles:
            h.remove()
        running_modules().clear()


@dataclass
class _Seen:
    """What one module's calls of its functions showed."""

    shapes: set[tuple[int, int, int, int]] = field(default_factory=set)  # (hk, dk, hv, dv)
    l2norm: set[bool] = field(default_factory=set)
    functions: set[str] = field(default_factory=set)
    activations: set[str | None] = field(default_factory=set)
    calls: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


class FunctionWatch:
    """The observed forward with every rule and convolution function of the described modules
    wrapped: each call is attributed to its module (Note [Whose call is it]) and recorded."""

    def __init__(self, model: nn.Module, graph: _core.HostGraph) -> None:
        self.model = model
        self.graph = graph
        by_path = dict(model.named_modules())
        self.rules = {path: by_path[path] for path in
                      (m.path for m in graph.modules if m.kind == _core.ModuleKind.recurrence)}
        self.convs = {by_path[m.path].weight.untyped_storage().data_ptr(): m.path
                      for m in graph.modules if m.kind == _core.ModuleKind.conv}
        self.seen: dict[str, _Seen] = {}
        self.functions = {f.qualname: f for mod in self.rules.values()
                          for f in called_functions(mod) if f.kind != "rotary"}

    def _record_rule(self, fn: Function, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        stack = running_modules()
        owner = next((m for m in reversed(stack) if any(m is r for r in self.rules.values())),
                     None)
        if owner is None:
            return
        path = next(p for p, m in self.rules.items() if m is owner)
        bound = inspect.signature(fn.original()).bind(*args, **kwargs)
        q, v = bound.arguments.get("query"), bound.arguments.get("value")
        seen = self.seen.setdefault(path, _Seen())
        if isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor) and q.dim() == v.dim() == 4:
            seen.shapes.add((q.shape[2], q.shape[3], v.shape[2], v.shape[3]))
            seen.calls.append((q.flatten(2), q))  # rows batch x tokens
        seen.l2norm.add(bool(bound.arguments.get("use_qk_l2norm_in_kernel", False)))
        seen.functions.add(fn.qualname)

    def _record_conv(self, fn: Function, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        bound = inspect.signature(fn.original()).bind(*args, **kwargs)
        w, x = bound.arguments.get("weight"), bound.arguments.get("hidden_states")
        if not isinstance(w, torch.Tensor) or not isinstance(x, torch.Tensor) or x.dim() != 3:
            return
        path = self.convs.get(w.untyped_storage().data_ptr())
        if path is None:
            return
        seen = self.seen.setdefault(path, _Seen())
        seen.functions.add(fn.qualname)
        seen.activations.add(bound.arguments.get("activation"))
        seen.calls.append((x, x))

    def _record(self, fn: Function, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        (self._record_rule if fn.kind == "rule" else self._record_conv)(fn, args, kwargs)

    def watching(self) -> AbstractContextManager[None]:
        return watched_calls(self.rules.values(), self.functions.values(), self._record)

    def write(self) -> None:
        """The dims and flags each module's calls showed, onto the graph; a convolution module's
        calls become its HostCalls (rows = batch x tokens, width = channels)."""
        modules = list(self.graph.modules)
        calls = list(self.graph.calls)
        for hm in modules:
            seen = self.seen.get(hm.path)
            if hm.kind == _core.ModuleKind.recurrence and seen is not None:
                rec = hm.recurrence
                if len(seen.shapes) == 1:
                    rec.k_heads, rec.k_dim, rec.v_heads, rec.v_dim = next(iter(seen.shapes))
                elif len(seen.shapes) > 1:
                    rec.form = _core.RecurrenceForm.other
                    rec.other = f"its calls had several shapes {sorted(seen.shapes)}"
                rec.l2norm = seen.l2norm == {True}
                if len(seen.l2norm) > 1:
                    rec.form = _core.RecurrenceForm.other
                    rec.other = "its calls differ in use_qk_l2norm_in_kernel"
                hm.recurrence = rec
                for x, q in seen.calls:  # the rule's calls are the function seam's calls
                    c = host_call(hm.path, x, q)
                    c.input_id = c.output_id = id(q)
                    calls.append(c)
            if hm.kind == _core.ModuleKind.conv and seen is not None:
                facts = hm.conv
                facts.functions = sorted(seen.functions)
                # Every convolution function its module calls is measured, not only those the
                # observed forwards reached (a prompt shows the prompt form, never the update):
                # the seat replaces them all.
                measured = all(measure_conv(f.original(), f.kind)
                               for f in self.functions.values() if f.is_conv)
                acts = seen.activations
                facts.activated = acts != {None}
                named = {CONV_ACTIVATIONS.get(a) if isinstance(a, str) else None for a in acts}
                one = named.pop() if len(acts) == 1 else None
                facts.activation = one if one is not None and measured else _core.Activation.unknown
                if not measured:
                    facts.activated = True  # refused by its attribute: no form it computes
                hm.conv = facts
                for x, _ in seen.calls:  # x stays alive in `seen`: its id is not reused
                    c = host_call(hm.path, x.transpose(1, 2), x)
                    c.input_id = c.output_id = id(x)
                    calls.append(c)
        self.graph.modules = modules
        self.graph.calls = calls

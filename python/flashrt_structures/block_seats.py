"""Decoder block seats: a whole decoder layer's decode step through the seats of its parts.

The block seat stands where the layer stands in the tree. For a decode call (one token per
sequence, rows in its band) it makes two calls into the core around the host's own cache update:
`head` (input norm, q/k/v, the per-head q/k norms, the rotary) writes the step's q, k and v; the
host's cache object takes k and v as the layer's attention would hand them (`cache.update`, the
layer's index, its keywords) and returns the keys and values to attend; `tail` (attention over
them with the model's mask, o, the residual, the post norm, the feed-forward, the residual)
writes the layer's output. Anything else runs the host's layer, whose sublayers keep their own
seats: a prompt (a band dispatch), a keyword or cache the block does not handle, a miss in
`head` (nothing of the host has changed yet). A miss of the attention in `tail` comes after the
cache took the step's keys, so the rest of the layer runs on the host's modules from there: the
host's attention implementation, the layer's o projection, norm and feed-forward.

Note [Block self-check]: identities on the observed call name the parts (observe/blocks.py), but
not every way a layer could compose them (which of two equal-width projections is k). So the
first decode call the block serves runs the host's layer too, with the cache's update watched:
the host's k and v for the step, the keys and values it attended and its output. The block's own
k, v and layer update (y - x) are compared with the host's by cosine (the core's value metrics,
judged by the core against the structure's parity pass); the call returns the host's output
either way. A failed check gives the layer back to the host for good, with the cosines as the
reason; the sublayers keep their seats.
"""

from __future__ import annotations

import warnings
from typing import Any, cast

import torch
from torch import nn

from . import _core, catalog
from .observe import attention as interface
from .seats import RAISE, RAN, RESTORE, GuardRefused, SeatModule

_COLLECTOR: Any
try:  # transformers collects hidden states and attention weights through hooks on the layers
    from transformers.utils.output_capturing import _active_collector as _COLLECTOR
except ImportError:  # pragma: no cover - an older transformers: nothing collects through hooks
    _COLLECTOR = None


def _collecting() -> bool:
    """True while the model's forward collects outputs (hidden states, attention weights) with
    hooks on its layers, which a block standing in a layer's place would not run."""
    return _COLLECTOR is not None and bool(_COLLECTOR.get())


# The plan's nodes that are the host's modules, not seats: the layer itself, a routed layer's
# feed-forward module (which a fallback runs), its router and its shared expert's gate (the
# block runs copies of their weights).
_HOST_ROLES = frozenset({"block", "moe", "router", "shared_gate"})

# The layer call's keywords the block reads itself; every other one goes to the cache update and
# the attention call, as the layer's attention module would pass it.
_OWN = frozenset({"hidden_states", "attention_mask", "position_embeddings", "cache",
                  "past_key_values"})


class BlockSeatModule(SeatModule):
    """A decoder layer seated as one block (op block)."""

    _parts: dict[str, SeatModule]  # set with object.__setattr__: not registered children

    def __init__(self, site: str, host: nn.Module, seat: _core.BlockSeat,
                 parts: dict[str, SeatModule], plan: _core.SeatPlan) -> None:
        super().__init__(site, host, seat)
        # The layer's own children, live: the block's children are whatever stands in the layer
        # (its parts' seats while they are attached), so train(), eval() and state_dict() reach
        # the same modules through the block as through the layer.
        object.__setattr__(self, "_modules", host._modules)
        # The parts' seat modules keep their core seats alive (the block holds raw pointers).
        object.__setattr__(self, "_parts", parts)
        nodes = dict(plan.seam.nodes)
        prefix = site + "."
        # Where each part stands below the layer: looked up at call time, so a fallback runs
        # whatever stands there then (a part's seat while attached, else the host's module).
        self._rel = {role: path[len(prefix):] for role, path in nodes.items()
                     if path.startswith(prefix)}
        attention = host.get_submodule(self._rel["attention"])
        layer_idx = getattr(attention, "layer_idx", None)
        if not isinstance(layer_idx, int):
            raise _core.Refused(f"{site}: its attention module has no layer index for the cache")
        self._layer_idx = layer_idx
        facts = plan.seam.attention
        self._heads, self._kv_heads, self._dim = facts.heads, facts.kv_heads, facts.head_dim
        self._window = facts.sliding_window or None
        self._pass = catalog.load(plan.seam.structure).gate.pass_
        self._ffn = "moe" if "moe" in self._rel else "ffn"  # the feed-forward the host runs
        self._checked = False

    @property
    def parts(self) -> dict[str, SeatModule]:
        """The seat modules of its parts, by role."""
        return dict(self._parts)

    @property
    def block(self) -> _core.BlockSeat:
        return cast(_core.BlockSeat, self._seat)

    def _part(self, role: str) -> nn.Module:
        return self._host.get_submodule(self._rel[role])

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return self._host(*args, **kwargs)
        x = args[0] if args else kwargs.get("hidden_states")
        if len(args) > 1 or not isinstance(x, torch.Tensor) or x.dim() != 3:
            return self._miss(self._seat.miss("a call other than (hidden_states [batch, tokens, "
                                              "hidden], keywords)"), args, kwargs)
        batch, tokens, _ = x.shape
        if tokens != 1:  # a prompt: 0 rows is outside every band, so this counts a dispatch
            return self._miss(self._seat.admit_rows(0), args, kwargs)
        verdict = self._seat.admit_rows(batch)
        if verdict != RAN:
            return self._miss(verdict, args, kwargs)
        cache: Any = kwargs.get("cache", kwargs.get("past_key_values"))
        tables: Any = kwargs.get("position_embeddings")
        mask = kwargs.get("attention_mask")
        rest = {k: v for k, v in kwargs.items() if k not in _OWN}
        why = ""
        if cache is None or not callable(getattr(cache, "update", None)):
            why = "no cache object with update() in the call"
        elif not (isinstance(tables, tuple) and len(tables) == 2
                  and all(isinstance(t, torch.Tensor) for t in tables)):
            why = "no rotary tables (cos, sin) in the call"
        elif mask is not None and not isinstance(mask, torch.Tensor):
            why = f"a {type(mask).__name__} mask"
        elif extra := interface.call_extras(rest):
            why = "the call passes " + ", ".join(extra)
        elif _collecting():
            why = "the forward collects hidden states or attention weights (hooks on the layer)"
        elif getattr(self._part("attention").config, "output_attentions", False):
            why = "the attention weights are asked for"
        elif x.requires_grad and torch.is_grad_enabled():
            why = "input requires grad (autograd)"
        elif not x.is_contiguous():
            why = f"input strides {x.stride()} not contiguous"
        if why:
            return self._miss(self._seat.miss(why), args, kwargs)
        cos, sin = tables
        q = torch.empty((batch, self._heads, 1, self._dim), dtype=x.dtype)
        k = torch.empty((batch, self._kv_heads, 1, self._dim), dtype=x.dtype)
        v = torch.empty_like(k)
        verdict = self.block.head(x, cos, sin, q, k, v, self.training)
        if verdict != RAN:
            self._sync_parts()
            return self._miss(verdict, args, kwargs)
        if not self._checked:
            return self._self_check(args, kwargs, x, q, k, v, cache, mask)
        keys, values = cache.update(k, v, self._layer_idx, kwargs=rest)
        y = torch.empty_like(x)
        try:
            verdict = self.block.tail(x, q, keys, values, mask, y, self.training)
        except Exception as e:  # the cache holds the step's keys: the host's modules finish it
            verdict = self._seat.miss(f"tail failed: {e}")
        if verdict == RAN:
            return y
        return self._rest_on_host(verdict, x, q, keys, values, mask, rest)

    def _sync_parts(self) -> None:
        """A part that gave its region back inside the block (its own 32nd miss in a row) goes
        back to the host like any seat that does."""
        for part in self._parts.values():
            if part.seat.ledger.restored and part._on_restore is not None:
                part._on_restore(part)

    def _rest_on_host(self, verdict: int, x: torch.Tensor, q: torch.Tensor, keys: torch.Tensor,
                      values: torch.Tensor, mask: Any, rest: dict[str, Any]) -> torch.Tensor:
        """The layer after the cache took the step's keys, on the host's modules (the tail's
        attention refused the call: nothing of it was written)."""
        reason = self._seat.ledger.last_reason
        if verdict == RAISE:
            raise GuardRefused(f"{self.site}: {reason} (seat form: {self._seat.form.describe()})")
        if self._seat.first_time(reason):
            warnings.warn(f"flashrt: {self.site} ran the host from its attention: {reason}",
                          RuntimeWarning, stacklevel=3)
        attention = self._part("attention")
        host_fn = interface.host_implementation(attention)
        if host_fn is None:
            raise RuntimeError(f"flashrt: {self.site}: the host's attention implementation is "
                               "gone while the block is attached")
        scaling = getattr(attention, "scaling", None)
        out, _ = host_fn(attention, q, keys, values, mask, dropout=0.0, scaling=scaling,
                         sliding_window=self._window, **rest)
        h = x + self._part("o")(out.reshape(*x.shape[:-1], -1).contiguous())
        y = h + self._part(self._ffn)(self._part("post_norm")(h))
        if verdict == RESTORE and self._on_restore is not None:
            self._on_restore(self)
        return y

    def _self_check(self, args: tuple[Any, ...], kwargs: dict[str, Any], x: torch.Tensor,
                    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: Any,
                    mask: Any) -> torch.Tensor:
        """Note [Block self-check]: the host's layer runs this call; the block is compared."""
        seen: dict[str, Any] = {}
        update = cache.update

        def watched(key_states: torch.Tensor, value_states: torch.Tensor, *a: Any,
                    **kw: Any) -> Any:
            out = update(key_states, value_states, *a, **kw)
            if a and a[0] == self._layer_idx and "keys" not in seen:
                seen.update(k=key_states, v=value_states, keys=out[0], values=out[1])
            return out

        own = vars(cache).get("update")  # an attribute of the instance's own, put back after
        try:
            cache.update = watched  # for this one call
            y_host = self._host(*args, **kwargs)
        finally:
            if own is not None:
                cache.update = own
            else:
                vars(cache).pop("update", None)
        if "keys" not in seen:
            why = "self-check: the host's layer did not update the cache at its index"
        elif not all(bool(torch.isfinite(t).all()) for t in (seen["k"], seen["v"], y_host)):
            return y_host  # nothing to compare on non-finite values: the next call checks
        else:
            y = torch.empty_like(x)
            try:
                verdict = self.block.tail(x, q, seen["keys"], seen["values"], mask, y,
                                          self.training)
            except Exception as e:  # a part that cannot run this call: the check fails
                verdict = self._seat.miss(f"tail failed: {e}")
            if verdict != RAN:
                why = f"self-check: the tail missed ({self._seat.ledger.last_reason})"
            else:
                def cosine(got: torch.Tensor, want: torch.Tensor) -> float:
                    return float(_core.value_metrics(got.contiguous(), want.contiguous()).cosine)
                why = _core.BlockSeat.judge(
                    [("k", cosine(k, seen["k"])), ("v", cosine(v, seen["v"])),
                     ("update", cosine(y - x, y_host - x))], self._pass)
        if not why:
            self._checked = True
            return y_host
        if self._seat.mode == _core.GuardMode.raise_:
            raise GuardRefused(f"{self.site}: {why}")
        self._seat.retire(why)  # for good: the same seat is not attached again
        warnings.warn(f"flashrt: {self.site}: {why}; the layer is the host's for good",
                      RuntimeWarning, stacklevel=3)
        if self._on_restore is not None:
            self._on_restore(self)
        return y_host

    def extra_repr(self) -> str:
        return f"{self._seat.form.describe()}, parts: {', '.join(sorted(self._rel))}"


def _host_weight(model: nn.Module, path: str) -> torch.Tensor | None:
    """The host's weight at `path` (a seat standing there holds the host's own parameters)."""
    weight = model.get_submodule(path)._parameters.get("weight")
    return weight.detach().contiguous() if isinstance(weight, torch.Tensor) else None


def build_block_seat(model: nn.Module, plan: _core.SeatPlan,
                     swaps: dict[str, SeatModule]) -> BlockSeatModule:
    """The block seat for one planned layer, from the seat modules built for its parts."""
    parts: dict[str, SeatModule] = {}
    for role, path in plan.seam.nodes.items():
        if role in _HOST_ROLES:
            continue
        if path not in swaps:
            raise _core.Refused(f"{plan.site}: its {role} ({path}) has no seat in this plan")
        parts[role] = swaps[path]
    # A routed layer: the core copies the router's weight and the shared expert's gate's (and
    # checks them).
    nodes = plan.seam.nodes
    router = _host_weight(model, nodes["router"]) if "router" in nodes else None
    gate = _host_weight(model, nodes["shared_gate"]) if "shared_gate" in nodes else None
    seat = _core.build_block_seat(plan, {role: s.seat for role, s in parts.items()},
                                  router=router, shared_gate=gate)
    module = BlockSeatModule(plan.site, model.get_submodule(plan.site), seat, parts, plan)
    module.plan = plan
    return module


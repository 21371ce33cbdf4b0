"""How a routed layer chooses and computes, measured on calls of its own (for decode_loop's plan).

A bank's router is the sibling holding its routing weight [experts, hidden] (`find_router`). It
is called on rows of its own, and what it returned is compared with the top-k of softmax(x W^T)
taken in fp32, as it is and renormalised to sum to one: the form is what the call showed, never a
config flag or a family's name (Mixtral's router renormalises with no flag; Qwen's follows
`norm_topk_prob`). A router that returns something else (logits alone, the choice being made in
its parent; a bias; sigmoid scores) is described as `other`, with what its call showed, so the
plan refuses it by name. The bank's gated form is measured the same way, on a call of its own
with a routing of its own (`measure_bank`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import _core
from ..seats import SeatModule
from .experts import describe_bank, find_router, measure_bank
from .probes import dtype_of

# Rows a measurement calls the module on: enough that a renormalised top-k and a plain one differ
# on every row unless k covers the whole bank.
_ROWS = 8


def _shapes(parts: tuple[Any, ...]) -> str:
    return ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
                     if isinstance(t, torch.Tensor) else type(t).__name__ for t in parts)


def _other(facts: _core.RouterFacts, why: str) -> _core.RouterFacts:
    facts.form = _core.RouterForm.other
    facts.other = why
    return facts


def _dense(rows: int, experts: int, index: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """The routing as [rows, experts]: each row's scores at its chosen experts, zero elsewhere
    (so two routings compare whatever order each lists its k experts in)."""
    out = torch.zeros(rows, experts, dtype=torch.float64)
    return out.scatter_(1, index.long(), scores.double())


def measure_router(mod: nn.Module, experts: int, hidden: int) -> _core.RouterFacts:
    """What `mod` computes from rows of its own, as RouterFacts."""
    facts = _core.RouterFacts()
    facts.experts, facts.hidden = experts, hidden
    weight = mod._parameters.get("weight")
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (experts, hidden):
        return _other(facts, f"it holds no routing weight [{experts}, {hidden}]")
    # State beside the weight (a bias, an expert-score correction, a learned scale) may bend the
    # choice by less than random rows show: another form, whatever its calls return.
    extra = [n for n, _ in mod.named_parameters() if n != "weight"]
    extra += [n for n, b in mod.named_buffers() if b is not None]
    if extra:
        return _other(facts, f"it holds {', '.join(extra)} beside its weight")
    g = torch.Generator().manual_seed(17)
    x = torch.randn(_ROWS, hidden, generator=g).to(weight.dtype)
    try:
        with torch.no_grad():
            out = mod(x)
    except Exception as e:  # noqa: BLE001 - a router that takes no [rows, hidden] rows
        return _other(facts, f"its call on [rows, {hidden}] rows raised {type(e).__name__}: {e}")
    parts = out if isinstance(out, tuple) else (out,)
    index = [t for t in parts if isinstance(t, torch.Tensor) and not t.is_floating_point()]
    if len(index) != 1 or index[0].dim() != 2 or index[0].shape[0] != _ROWS:
        return _other(facts, f"its call returns ({_shapes(parts)}), no [rows, k] expert choice: "
                             f"the choice is made outside it")
    chosen = index[0]
    k = chosen.shape[1]
    facts.top_k = k
    floats = [t for t in parts if isinstance(t, torch.Tensor) and t.is_floating_point()]
    scores = [t for t in floats if t.shape == chosen.shape]
    logits = [t for t in floats if tuple(t.shape) == (_ROWS, experts)]
    if len(scores) != 1 or len(logits) != 1:
        return _other(facts, f"its call returns ({_shapes(parts)}), not (logits [rows, "
                             f"{experts}], scores [rows, k], indices [rows, k])")
    tol = 1e-5 if weight.dtype == torch.float32 else 2e-2
    with torch.no_grad():
        want = x.float() @ weight.detach().float().T
    got = logits[0].float()
    if not torch.allclose(got, want, rtol=tol, atol=tol * float(want.abs().max())):
        return _other(facts, "its logits are not x W^T")
    if bool((chosen < 0).any()) or bool((chosen >= experts).any()):
        return _other(facts, f"it chose experts outside 0..{experts - 1}")
    probs = torch.softmax(got, dim=-1)
    top = torch.topk(probs, k, dim=-1)
    mine = _dense(_ROWS, experts, chosen, scores[0].float())
    plain = _dense(_ROWS, experts, top.indices, top.values)
    renormalised = _dense(_ROWS, experts, top.indices,
                          top.values / top.values.sum(dim=-1, keepdim=True))
    if torch.allclose(mine, plain, rtol=tol, atol=tol * 1e-2):
        facts.form = _core.RouterForm.softmax_topk  # also when k covers the bank (the same)
    elif torch.allclose(mine, renormalised, rtol=tol, atol=tol * 1e-2):
        facts.form = _core.RouterForm.softmax_topk_renormalised
    else:
        return _other(facts, f"its top-{k} scores are neither softmax(x W^T)'s top-{k} nor "
                             f"those renormalised to sum to one")
    return facts


def _probe_bank(mod: nn.Module, facts: _core.ExpertFacts, top_k: int) -> _core.Activation:
    """The bank's gated form, measured on a call of its own with a routing of its own."""
    down = getattr(mod, facts.down)
    g = torch.Generator().manual_seed(19)
    k = max(1, min(top_k, facts.experts))
    x = torch.randn(4, facts.hidden, generator=g).to(down.dtype)
    index = torch.stack([torch.randperm(facts.experts, generator=g)[:k] for _ in range(4)])
    weights = torch.rand(4, k, generator=g).to(down.dtype)
    try:
        with torch.no_grad():
            out = mod(x, index, weights)
    except Exception:  # noqa: BLE001 - a bank not called as (hidden, index, weights)
        return _core.Activation.unknown
    act = measure_bank(mod, facts, (x, index, weights), out)
    return act if act is not None else _core.Activation.unknown


def _measure_router_of(model: nn.Module, modules: list[_core.HostModule], by_path: dict[str, int],
                       facts: _core.ExpertFacts) -> _core.HostModule | None:
    """The bank's router in `modules` with its form measured (written back there), or None when
    the bank has no router located."""
    if not facts.router or facts.router not in by_path:
        return None
    j = by_path[facts.router]
    router = modules[j]
    mod = model.get_submodule(facts.router)
    router.router = measure_router(mod, facts.experts, facts.hidden)
    weight = mod._parameters.get("weight")
    if isinstance(weight, torch.Tensor):
        router.weight_dtype = dtype_of(weight.dtype)
    modules[j] = router
    return router


def measure_routers(model: nn.Module, graph: _core.HostGraph) -> None:
    """The form of each bank's router (the door's: a routed decoder block runs the router
    itself, Note [Routed decoder block] in planner/plan.cpp), measured on a call of its own. A
    host without banks is left as it is."""
    modules = list(graph.modules)
    by_path = {hm.path: i for i, hm in enumerate(modules)}
    found = [_measure_router_of(model, modules, by_path, hm.experts) for hm in list(modules)
             if hm.kind == _core.ModuleKind.experts]
    if any(r is not None for r in found):
        graph.modules = modules


def describe_routing(model: nn.Module, graph: _core.HostGraph) -> None:
    """Adds to `graph` what a decode plan reads of each bank of experts: a seated bank's facts
    (read from the host bank under the seat), each bank's gated form, and its router's form,
    all measured on calls of their own. A host without banks is left as it is."""
    modules = list(graph.modules)
    by_path = {hm.path: i for i, hm in enumerate(modules)}
    changed = False
    for i, hm in enumerate(list(modules)):
        seated = hm.seated == _core.OpKind.moe_ffn
        if hm.kind != _core.ModuleKind.experts and not seated:
            continue
        mod = model.get_submodule(hm.path)
        host = mod.host if isinstance(mod, SeatModule) else mod
        facts = describe_bank(host)
        if facts is None:
            continue
        parent_path, _, name = hm.path.rpartition(".")
        facts.router = find_router(model.get_submodule(parent_path), parent_path, name, facts)
        router = _measure_router_of(model, modules, by_path, facts)
        if not facts.transposed:
            hm.activation = _probe_bank(host, facts, router.router.top_k if router else 1)
        hm.experts = facts
        modules[i] = hm
        changed = True
    if changed:
        graph.modules = modules

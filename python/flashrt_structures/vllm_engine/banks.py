"""vLLM's fused expert bank (`FusedMoE`: in vLLM 0.32 a `MoERunner` whose `routed_experts` child
holds the weights): recognised, refused, described as a bank of experts, observed and seated.

The bank is the module holding `w13_weight` [E, 2F, D] (gate rows, then up rows: vLLM's loader
puts `w1` / gate_proj in the first half and `w3` / up_proj in the second) and `w2_weight`
[E, D, F], applied by a `quant_method`. vLLM routes: its router (`select_experts`, the top-k and
renormalisation its config asks for, any scaling) runs before the bank, and the runner calls
`routed_experts.quant_method.apply(layer, x, topk_weights, topk_ids, shared_experts,
shared_experts_input)` with the choice. That call is the seam: the seat is placed as the method's
own `apply` (an instance attribute over the class's, removed on detach), and takes
(x [rows, D], topk_ids, topk_weights); rows beyond the band and every miss run the method's own
apply (on CPU, vLLM's `cpu_fused_moe`). The router stays vLLM's.

Note [The bank in the window]: like a projection's weight, the bank's tensors are held by
reference before `process_weights_after_loading` (on CPU it then pads the intermediate size and
prepacks both banks into new parameters), and the seat is packed from them. What the bank computes
is measured on a call of the bank's own through the engine's method, against those tensors
(`observe.experts.measure_bank`), never read from its class. What the bank op cannot take is read
from the layer before planning (`bank_refusal`) and named in the report with that reason; such a
bank still goes to the plan as a bank, unmeasured (activation unknown, its biases declared), so
the plan refuses it at its boundary too and keeps its router at host precision.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import torch
from torch import nn

from .. import _core, observe
from ..observe.experts import measure_bank
from ..seats import BankSeat

GATE_UP, DOWN = "w13_weight", "w2_weight"
# vLLM's activation names the bank op computes (gated: act(gate x) * up x).
_ACTIVATIONS = {"silu", "gelu_tanh"}


def engine_bank(mod: nn.Module) -> bool:
    """A serving engine's fused expert bank, recognised by what it holds: 3-D `w13_weight` and
    `w2_weight` applied by a `quant_method`."""
    w13, w2 = mod._parameters.get(GATE_UP), mod._parameters.get(DOWN)
    return (isinstance(w13, torch.Tensor) and isinstance(w2, torch.Tensor)
            and w13.dim() == 3 and w2.dim() == 3
            and callable(getattr(getattr(mod, "quant_method", None), "apply", None)))


def banks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(p, m) for p, m in model.named_modules() if engine_bank(m)]


def _shape(t: torch.Tensor) -> str:
    return f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def shapes(mod: nn.Module) -> str:
    """"w13_weight [4, 512, 256] float32, w2_weight [4, 256, 256] float32" (before repacking)."""
    return ", ".join(f"{n} {_shape(t)}" for n, t in mod._parameters.items() if t is not None)


def expert_parallel(mod: nn.Module) -> str:
    """Why the bank is only part of the experts in this process (expert parallel), or ""."""
    config = getattr(getattr(mod, "moe_config", None), "moe_parallel_config", None)
    ep = int(getattr(config, "ep_size", 1) or 1) if config is not None else 1
    local, total = getattr(mod, "local_num_experts", None), getattr(mod, "global_num_experts", None)
    if (config is not None and getattr(config, "use_ep", False)) or ep > 1 or (
            getattr(mod, "expert_map", None) is not None) or (
            local is not None and total is not None and local != total):
        return (f"expert parallel (ep size {ep}): this process holds {local} of the {total} "
                "experts and vLLM combines their outputs across processes; the bank seat takes "
                "the whole bank (ep = 1)")
    return ""


def bank_refusal(mod: nn.Module) -> str:
    """Why this bank cannot be seated, read before the engine repacks it, or "". What the bank
    computes is measured on its call afterwards; these are what its call could not show."""
    method = mod.quant_method
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )
    what = f"{type(mod).__name__} ({shapes(mod)})"
    if not isinstance(method, UnquantizedFusedMoEMethod):
        return (f"quantized expert bank: {type(method).__name__} applies {what} in the "
                "checkpoint's own form; the bank op reads f32 or bf16 banks")
    if why := expert_parallel(mod):
        return why
    if any(isinstance(mod._parameters.get(n), torch.Tensor) for n in ("w13_bias", "w2_bias")) or (
            getattr(getattr(mod, "moe_config", None), "has_bias", False)):
        return f"per-expert biases in {what}; the bank op is bias-free"
    act = getattr(getattr(mod, "activation", None), "value", None)
    if act not in _ACTIVATIONS:
        return (f"activation {act} in {what}: the bank op computes act(gate x) * up x with "
                f"{' or '.join(sorted(_ACTIVATIONS))}")
    clamp = {n: getattr(mod, n, None) for n in ("swiglu_limit", "swiglu_alpha", "swiglu_beta")}
    if any(v is not None for v in clamp.values()):
        set_ = ", ".join(f"{n}={v}" for n, v in clamp.items() if v is not None)
        return f"a clamped gate ({set_}) in {what}; the bank op's gate is unclamped"
    if getattr(mod, "apply_router_weight_on_input", False):
        return (f"router weights applied to the input (apply_router_weight_on_input) in {what}; "
                "the bank op weights each expert's output")
    w13, w2 = (cast(torch.Tensor, mod._parameters[n]) for n in (GATE_UP, DOWN))
    if tuple(w13.shape) != (w2.shape[0], 2 * w2.shape[2], w2.shape[1]):
        return f"banks of {what} are not gate/up [E, 2F, D] and down [E, D, F]"
    return ""


def router_of(model: nn.Module, path: str, mod: nn.Module) -> str:
    """The path of the module holding the bank's routing weight [E, D]: the runner's `gate` when
    it holds it, else a sibling of the runner (the block's `gate`); "" when none does."""
    w2 = cast(torch.Tensor, mod._parameters[DOWN])
    want = (int(w2.shape[0]), int(w2.shape[1]))
    paths = {id(m): p for p, m in model.named_modules()}
    runner_path = path.rpartition(".")[0]
    runner = model.get_submodule(runner_path) if runner_path else model
    candidates = [getattr(runner, "gate", None)]
    block_path = runner_path.rpartition(".")[0]
    if runner_path:
        block = model.get_submodule(block_path) if block_path else model
        candidates += [c for _, c in block.named_children()]
    for c in candidates:
        w = getattr(c, "_parameters", {}).get("weight") if isinstance(c, nn.Module) else None
        if isinstance(w, torch.Tensor) and tuple(w.shape) == want and id(c) in paths:
            return paths[id(c)]
    return ""


def describe(model: nn.Module, path: str, mod: nn.Module) -> _core.HostModule:
    """The bank as the core sees it (its top-k from its observed calls, its activation measured
    after: `CallObserver`)."""
    w2 = cast(torch.Tensor, mod._parameters[DOWN])
    facts = _core.ExpertFacts()
    facts.experts, facts.hidden, facts.intermediate = (int(w2.shape[0]), int(w2.shape[1]),
                                                       int(w2.shape[2]))
    facts.gate_up, facts.down = GATE_UP, DOWN
    facts.has_bias = any(n.endswith("_bias") and isinstance(t, torch.Tensor)
                         for n, t in mod._parameters.items())
    facts.top_k = int(getattr(mod, "top_k", 0) or 0)
    facts.router = router_of(model, path, mod)
    hm = _core.HostModule()
    hm.path, hm.type_name, hm.kind = path, type(mod).__name__, _core.ModuleKind.experts
    hm.children = [f"{path}.{n}" for n, _ in mod.named_children()]
    hm.experts = facts
    hm.in_features = hm.out_features = facts.hidden
    hm.weight_dtype = observe.dtype_of(w2.dtype)
    hm.weight_device = w2.device.type
    hm.weight_id = w2.data_ptr()
    hm.activation = _core.Activation.unknown  # measured on a call of its own (CallObserver)
    return hm


class CallObserver:
    """Observes the banks during the hook's forward: each bank's method gets an `apply` that
    runs its own and records the call (rows, width, dtype) and its top-k. The forward's values
    are the profiling form's (no attention metadata: zeros, or worse), so what the gated form
    computes is measured after, on a call of the bank's own (`measure`)."""

    def __init__(self, model: nn.Module, graph: _core.HostGraph,
                 held: dict[str, dict[str, torch.Tensor]]) -> None:
        self.model, self.held = model, held
        self.facts = {m.path: m.experts for m in graph.modules
                      if m.kind == _core.ModuleKind.experts}
        self.calls: list[_core.HostCall] = []
        self.top_k: dict[str, int] = {}
        self.routing: dict[str, tuple[torch.dtype, torch.dtype]] = {}  # ids, weights dtypes
        self._keep: list[torch.Tensor] = []

    def __enter__(self) -> CallObserver:
        for path in self.facts:
            method: Any = self.model.get_submodule(path).quant_method
            object.__setattr__(method, "apply", self._observed(path, method.apply))
        return self

    def __exit__(self, *exc: object) -> None:
        for path in self.facts:
            method: Any = self.model.get_submodule(path).quant_method
            method.__dict__.pop("apply", None)
        self._keep.clear()

    def _observed(self, path: str, apply: Any):
        def observed(layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            out = apply(layer, x, topk_weights, topk_ids, *args, **kwargs)
            if isinstance(out, torch.Tensor) and isinstance(x, torch.Tensor):
                self._keep.extend((x, out))
                self.calls.append(observe.host_call(path, x, out))
                self.top_k[path] = max(self.top_k.get(path, 0), int(topk_ids.shape[-1]))
                self.routing[path] = (topk_ids.dtype, topk_weights.dtype)
            return out
        return observed

    def measure(self, path: str) -> _core.Activation:
        """The bank's gated form on rows of its own with a routing of its own, through the
        engine's own method, against the held banks."""
        facts = self.facts[path]
        layer = self.model.get_submodule(path)
        method: Any = layer.quant_method
        down = self.held[path][DOWN]
        ids_dtype, weights_dtype = self.routing.get(path, (torch.int32, torch.float32))
        k = max(1, min(self.top_k.get(path) or facts.top_k or 1, facts.experts))
        g = torch.Generator().manual_seed(19)
        x = torch.randn(4, facts.hidden, generator=g).to(down.dtype)
        index = torch.stack([torch.randperm(facts.experts, generator=g)[:k]
                             for _ in range(4)]).to(ids_dtype)
        weights = torch.rand(4, k, generator=g).to(weights_dtype)
        try:
            with torch.no_grad():
                out = type(method).apply(method, layer, x, weights, index, None, None)
        except Exception:  # noqa: BLE001 - a bank not called as vLLM's runner calls it
            return _core.Activation.unknown
        act = measure_bank(SimpleNamespace(**self.held[path]),  # type: ignore[arg-type]
                           facts, (x, index, weights), out)
        return act if act is not None else _core.Activation.unknown

    def write(self, graph: _core.HostGraph) -> None:
        """The banks' calls appended to the graph's; each bank's measured activation and the
        top-k its calls carried. A bank the door refused (its tensors not held) is not measured:
        its activation stays unknown, so the plan refuses it too."""
        modules = list(graph.modules)
        for hm in modules:
            if hm.path in self.facts:
                facts = hm.experts
                facts.top_k = self.top_k.get(hm.path, facts.top_k)
                hm.experts = facts
                self.facts[hm.path] = facts
                if hm.path in self.held:
                    hm.activation = self.measure(hm.path)
        graph.modules = modules
        graph.calls = list(graph.calls) + self.calls


class BankHost(nn.Module):
    """What a bank seat falls back to: the engine's own method on the bank layer, with no shared
    experts (the seated apply already ran them)."""

    layer: nn.Module
    method: Any

    def __init__(self, layer: nn.Module, method: Any) -> None:
        super().__init__()
        object.__setattr__(self, "layer", layer)  # neither is a child: the seat must not
        object.__setattr__(self, "method", method)  # re-register the engine's modules

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor) -> torch.Tensor:
        # The class's apply: the instance attribute is the seat while it is placed.
        return type(self.method).apply(self.method, self.layer, x, topk_weights, topk_ids,
                                       None, None)


def seat(model: nn.Module, plan: _core.SeatPlan, held: dict[str, dict[str, torch.Tensor]]
         ) -> tuple[BankSeat, Any, Any]:
    """The bank seat of `plan`, packed from the held banks, and its place / undo: the seat is
    the bank method's `apply` while placed."""
    tensors = {}
    for op, slot in plan.slots.items():
        t = held[slot.module][slot.tensor]
        tensors[op] = t.chunk(slot.parts, dim=1)[slot.part] if slot.parts > 1 else t
    core_seat = _core.build_seat(plan, tensors)
    layer = model.get_submodule(plan.site)
    method: Any = layer.quant_method
    module = BankSeat(plan.site, BankHost(layer, method).eval(), core_seat)
    from vllm.model_executor.layers.fused_moe.runner.shared_experts import SharedExpertsOrder
    overlapped = SharedExpertsOrder.MK_INTERNAL_OVERLAPPED

    def apply(layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, shared_experts: Any = None,
              shared_experts_input: torch.Tensor | None = None) -> torch.Tensor:
        if shared_experts is not None:
            # What vLLM's kernel does with them: run here when they overlap with it (a no-op in
            # any other order; the runner ran them before the bank then).
            shared_experts(shared_experts_input, overlapped)
        return module(x, topk_ids, topk_weights)

    def place() -> None:
        object.__setattr__(method, "apply", apply)

    def undo() -> None:
        method.__dict__.pop("apply", None)
    return module, place, undo

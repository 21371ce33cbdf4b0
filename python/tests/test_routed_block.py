"""Routed decoder layers as blocks (Note [Routed decoder block] in planner/plan.cpp): a layer
whose feed-forward is a router and a seated bank of experts, with or without a seated shared
expert and its sigmoid gate, runs its decode step as one block, the router in the core;
anything else in that feed-forward keeps the layer with the host."""

from __future__ import annotations

import copy

import pytest
import torch

import flashrt_structures as S
from flashrt_structures.block_seats import BlockSeatModule

import hosts
import moe_hosts

# The families whose feed-forward is a softmax top-k router and a bank (Qwen2-MoE: and a shared
# expert with its sigmoid gate).
ROUTED = {"qwen3_moe": moe_hosts.qwen3_moe, "mixtral": moe_hosts.mixtral,
          "qwen3_moe_plain_topk": lambda: moe_hosts.qwen3_moe(norm_topk_prob=False),
          "qwen2_moe": moe_hosts.qwen2_moe}
EVERY = list(S.list_structures())
WITHOUT_BLOCKS = [s for s in EVERY if s != "decoder_block"]


def plan_of(model, structures=None):
    step = hosts.ids(1, seed=3)
    return S.auto_swaps(model, lambda: model(step), scheme="w8a16_decode",
                        structures=structures, min_seat_weights=0)


def blocks(plan) -> dict[str, BlockSeatModule]:
    return {p: s for p, s in plan.swaps.items() if isinstance(s, BlockSeatModule)}


def kept_layer(model, layer: str = "model.layers.0"):
    """The plan of a host none of whose layers is a block, and why `layer` stays the host's."""
    plan = plan_of(model)
    assert not blocks(plan)
    return plan, plan.notes["scheme"]["keep_host"][layer]


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(),
                                                 dim=0).item()


generate = hosts.generate_attached


def assert_step_reads_a_copy_of(model, weight: torch.Tensor) -> None:
    """The attached model's decode step is the same with the host's `weight` negated: the
    blocks read their own copy of it."""
    x = hosts.ids(1)
    with torch.no_grad():
        past = model(hosts.ids(5), use_cache=True).past_key_values
        model(x, past_key_values=past, use_cache=True)  # the self-check's call (the host's layer)
        again = copy.deepcopy(past)
        first = model(x, past_key_values=past, use_cache=True).logits
        saved = weight.detach().clone()
        weight.data.mul_(-1)
        second = model(x, past_key_values=again, use_cache=True).logits
        weight.data.copy_(saved)
    assert torch.equal(first, second)


@pytest.mark.parametrize("family", sorted(ROUTED))
def test_a_routed_layer_is_one_block_and_decodes_as_its_seated_sublayers(family):
    model = ROUTED[family]()
    snap = hosts.snapshot(model)
    with_blocks, without = plan_of(model), plan_of(model, WITHOUT_BLOCKS)
    layers = model.config.num_hidden_layers
    assert sorted(blocks(with_blocks)) == [f"model.layers.{i}" for i in range(layers)]
    block_plan = next(sp for sp in with_blocks.seams if sp.site == "model.layers.0")
    nodes = dict(block_plan.seam.nodes)
    assert nodes["bank"] == "model.layers.0.mlp.experts" and nodes["moe"] == "model.layers.0.mlp"
    router = block_plan.seam.router
    assert router.top_k == model.config.num_experts_per_tok and router.experts >= 12
    prompt = hosts.ids(7)
    got, report = generate(model, with_blocks, prompt)
    want, _ = generate(model, without, prompt)
    # The block's router sums in its own order (the dense op, not torch's), so the routing
    # weights differ from the host router's in the last bits: values, not bits.
    assert torch.equal(got.sequences, want.sequences)
    assert min(cosine(a, b) for a, b in zip(got.logits, want.logits, strict=True)) >= 0.9999
    for i in range(layers):
        r = report[f"model.layers.{i}"]
        assert r["band_dispatches"] == 1 and r["fallbacks"] == 0 and not r["restored"], r
        assert r["calls"] == 1 + 31, r
        bank = report[f"model.layers.{i}.mlp.experts"]
        # The bank's seat serves the prompt's rows (in its band, inside the host's layer), the
        # self-check's host layer and each of the 31 steps inside the block.
        assert bank["fallbacks"] == 0 and bank["calls"] == 1 + 1 + 31, bank
    assert hosts.same_weights(model, snap)


def test_a_shared_expert_is_in_the_block_mixed_by_its_copied_gate():
    model = moe_hosts.qwen2_moe()
    snap = hosts.snapshot(model)
    plan = plan_of(model)
    sp = next(s for s in plan.seams if s.site == "model.layers.0")
    nodes = dict(sp.seam.nodes)
    assert nodes["shared"] == "model.layers.0.mlp.shared_expert"
    assert nodes["shared_gate"] == "model.layers.0.mlp.shared_expert_gate"
    assert ("model.layers.0.mlp.shared_expert: added as sigmoid(model.layers.0.mlp."
            "shared_expert_gate x) * shared(x) to the routed experts' sum") in "\n".join(
                plan.notes["assumed"])
    # The block's gate is a copy of the host's fp32 weight: the seat standing for the gate (w8
    # here) serves the host's forward, the block reads its own copy.
    handle = plan.attach(model)
    try:
        block = model.model.layers[0]
        assert isinstance(block, BlockSeatModule)
        assert_step_reads_a_copy_of(model, block.mlp.shared_expert_gate.weight)
    finally:
        handle.detach()
    assert hosts.same_weights(model, snap)


def test_a_shared_expert_gate_with_a_bias_keeps_the_layer_naming_it():
    model = moe_hosts.qwen2_moe()
    for layer in model.model.layers:
        biased = torch.nn.Linear(model.config.hidden_size, 1, bias=True)
        biased.weight.data.copy_(layer.mlp.shared_expert_gate.weight)
        layer.mlp.shared_expert_gate = biased
    plan, kept = kept_layer(model)
    assert ("ffn model.layers.0.mlp: its shared expert's gate model.layers.0.mlp."
            "shared_expert_gate [1, 256] has a bias") in kept, kept
    # The bank and the shared expert keep their own seats.
    assert {"model.layers.0.mlp.experts", "model.layers.0.mlp.shared_expert"} <= set(plan.swaps)


def remix_shared_expert(model, mix) -> None:
    """Every Qwen2-MoE feed-forward's forward made bank(x) + mix(mlp, x), where the family's own
    adds sigmoid(x g) * shared(x)."""
    for layer in model.model.layers:

        def forward(hidden, mlp=layer.mlp):
            rows = hidden.reshape(-1, hidden.shape[-1])
            _, weights, chosen = mlp.gate(rows)
            return (mlp.experts(rows, chosen, weights) + mix(mlp, rows)).reshape(hidden.shape)

        layer.mlp.forward = forward


def test_a_shared_expert_without_a_gate_keeps_the_layer_naming_it():
    """A shared expert added as it is, with no sigmoid gate (a form the block does not mix)."""
    model = moe_hosts.qwen2_moe()
    for layer in model.model.layers:
        del layer.mlp.shared_expert_gate
    remix_shared_expert(model, lambda mlp, rows: mlp.shared_expert(rows))
    plan, kept = kept_layer(model)
    assert ("ffn model.layers.0.mlp: its shared expert model.layers.0.mlp.shared_expert has no "
            "[1, 256] gate beside it") in kept, kept
    assert {"model.layers.0.mlp.experts", "model.layers.0.mlp.shared_expert"} <= set(plan.swaps)


def test_a_shared_expert_without_a_seat_keeps_the_layer_naming_it():
    """Planned without decoder_ffn, the shared expert stays with the host: the block would not
    compute it, so the layer stays with the host's forward, its bank still seated."""
    model = moe_hosts.qwen2_moe()
    plan = plan_of(model, [s for s in EVERY if s != "decoder_ffn"])
    assert not blocks(plan)
    kept = plan.notes["scheme"]["keep_host"]["model.layers.0"]
    assert ("ffn model.layers.0.mlp: it holds model.layers.0.mlp.shared_expert.") in kept, kept
    assert "in no feed-forward seat of this plan" in kept, kept
    assert "model.layers.0.mlp.experts" in plan.swaps
    assert "model.layers.0.mlp.shared_expert" not in plan.swaps


def test_a_shared_expert_mixed_otherwise_fails_the_block_s_self_check():
    """The plan assumes the feed-forward adds sigmoid(x g) * shared(x); a module that subtracts
    it instead has the same parts, so only the first decode call's check can tell."""
    model = moe_hosts.qwen2_moe()
    remix_shared_expert(model, lambda mlp, rows: -torch.sigmoid(mlp.shared_expert_gate(rows))
                        * mlp.shared_expert(rows))
    plan = plan_of(model)
    assert sorted(blocks(plan)) == ["model.layers.0", "model.layers.1"]
    handle = plan.attach(model)
    try:
        with pytest.warns(RuntimeWarning, match="self-check against the host's layer"):
            with torch.no_grad():
                past = model(hosts.ids(5), use_cache=True).past_key_values
                got = model(hosts.ids(1), past_key_values=past, use_cache=True).logits
        report = {x["site"]: x for x in handle.report()}
        assert report["model.layers.0"]["restored"], report["model.layers.0"]
        assert not isinstance(model.model.layers[0], BlockSeatModule)
    finally:
        handle.detach()
    with torch.no_grad():
        past = model(hosts.ids(5), use_cache=True).past_key_values
        want = model(hosts.ids(1), past_key_values=past, use_cache=True).logits
    assert cosine(got, want) >= 0.999  # the call returned the host's layer's output


def test_q_and_k_norms_over_the_whole_projection_keep_the_layer_naming_them():
    """OLMoE norms q and k over all heads at once: its layers stay the host's, parts seated."""
    model = moe_hosts.olmoe()
    plan, kept = kept_layer(model, "model.layers.1")
    assert ("its q_norm model.layers.1.self_attn.q_norm norms 256 values at once, the whole "
            "projection; the block norms each head of 64") in kept, kept
    assert {"model.layers.1.mlp.experts", "model.layers.1.self_attn.q_norm"} <= set(plan.swaps)


def test_a_router_outside_the_softmax_top_k_form_keeps_the_layer_naming_it():
    """A Qwen3-MoE whose routers score the experts with a sigmoid (as DeepSeek-V3's do): the
    measured form is not the block's, so the layer stays with the host, the router named."""
    model = moe_hosts.qwen3_moe()
    for layer in model.model.layers:
        gate = layer.mlp.gate

        def sigmoid_router(x, gate=gate):
            logits = torch.nn.functional.linear(x.reshape(-1, gate.hidden_dim), gate.weight)
            top = torch.topk(torch.sigmoid(logits), gate.top_k, dim=-1)
            return logits, top.values.to(x.dtype), top.indices

        gate.forward = sigmoid_router
    plan, kept = kept_layer(model)
    assert ("its router: model.layers.0.mlp.gate (Qwen3MoeTopKRouter) does not route as the "
            "top-k of softmax(x W^T)") in kept, kept
    assert "model.layers.0.mlp.experts" in plan.swaps  # the bank keeps its seat


def test_the_block_s_router_is_a_copy_and_detach_gives_everything_back():
    model = moe_hosts.qwen3_moe()
    layer = model.model.layers[0]
    params = dict(model.named_parameters())
    snap = hosts.snapshot(model)
    x = hosts.ids(1)
    with torch.no_grad():
        want = model(x).logits
    handle = plan_of(model).attach(model)
    assert isinstance(model.model.layers[0], BlockSeatModule)
    # Writing the host's router weight while attached changes nothing the block computes.
    assert_step_reads_a_copy_of(model, model.model.layers[0].mlp.gate.weight)
    handle.detach()
    assert model.model.layers[0] is layer
    with torch.no_grad():
        assert torch.equal(model(x).logits, want)
    for n, p in model.named_parameters():
        assert p is params[n]
    assert hosts.same_weights(model, snap)


def test_a_step_asking_for_router_logits_runs_the_host_layer_with_its_router():
    """The router logits are collected by hooks on the router modules, which a block does not
    call: such a step runs the host's layer (its parts keep their seats), counted."""
    model = moe_hosts.qwen3_moe()
    want, got, report = moe_hosts.step_asking_for_router_logits(model, plan_of(model))
    assert len(got.router_logits) == len(want.router_logits) == len(model.model.layers)
    assert min(cosine(a, b) for a, b in zip(got.router_logits, want.router_logits)) >= 0.999
    assert cosine(got.logits, want.logits) >= 0.999
    r = report["model.layers.0"]
    assert r["fallbacks"] == 1 and "collects" in r["last_reason"], r


def test_a_bf16_router_keeps_the_layer_naming_it():
    """The block routes on an fp32 copy, as an fp32 host does; a bf16 host's layers stay its own
    (its bank keeps its own seat where a form takes it)."""
    model = moe_hosts.qwen3_moe().to(torch.bfloat16)
    plan, kept = kept_layer(model)
    assert "its router model.layers.0.mlp.gate holds bf16 weights" in kept, kept


def test_a_router_holding_a_score_correction_is_another_form():
    """Ernie 4.5 MoE's router adds a learned correction to the expert scores before the top-k
    (`moe_statics.e_score_correction_bias`): a bias small enough that random rows may choose as
    a plain softmax top-k would, so the router's own state names the form, not its calls."""
    from transformers import Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM

    from flashrt_structures.observe.routing import measure_router

    torch.manual_seed(16)
    cfg = Ernie4_5_MoeConfig(vocab_size=hosts.VOCAB, hidden_size=256, num_attention_heads=4,
                             num_key_value_heads=2, num_hidden_layers=2, intermediate_size=512,
                             moe_intermediate_size=128, moe_num_experts=16, moe_k=4,
                             moe_num_shared_experts=0, moe_layer_start_index=0)
    model = Ernie4_5_MoeForCausalLM(cfg).eval()
    gate = model.model.layers[1].mlp.gate
    with torch.no_grad():
        gate.moe_statics.e_score_correction_bias.normal_(0, 5e-4)
    facts = measure_router(gate, 16, 256)
    assert facts.form == S._core.RouterForm.other
    assert "moe_statics.e_score_correction_bias beside its weight" in facts.other, facts.other
    plan = plan_of(model)
    assert not blocks(plan)

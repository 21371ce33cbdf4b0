"""decode_loop on real hosts: greedy tokens against the host's own generate, teacher-forced
agreement for the seated forms, determinism, and the stacks it must refuse."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import (
    Ernie4_5Config,
    Ernie4_5ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import flashrt_structures as S

import decoder_hosts
import hosts

warnings.filterwarnings("ignore", category=FutureWarning)


def teacher_forced_agreement(model, loop, seq):
    with torch.no_grad():
        host = model(seq).logits[0].argmax(-1).tolist()
    mine = loop.teacher_forced(seq)
    return sum(a == b for a, b in zip(mine, host)) / len(host)


@pytest.mark.parametrize("make", [hosts.qwen3, hosts.llama])
def test_greedy_tokens_equal_the_hosts_generate(make):
    model = make()
    ids = hosts.ids(9, seed=4)
    loop = S.decode_loop(model, max_len=64)
    want = hosts.generate(model, ids, 24)
    got = loop.generate(ids, 24)
    assert got.shape == want.shape == (1, 33) and got.dtype == torch.long
    div = hosts.first_divergence(model, got, want, 9)
    if div is not None:  # allowed only inside the rounding of two summation orders
        step, margin = div
        assert margin < 1e-4, f"diverged at step {step} with host top-2 margin {margin}"
    assert teacher_forced_agreement(model, loop, want[:, :-1]) >= 0.999


def test_two_runs_and_generate_from_give_the_same_tokens():
    model = hosts.qwen3()
    ids = hosts.ids(7, seed=5)
    loop = S.decode_loop(model, max_len=48)
    a, b = loop.generate(ids, 16), loop.generate(ids, 16)
    c = loop.generate_from(ids, 16)
    assert torch.equal(a, b) and torch.equal(a, c)
    assert loop.timing["prefill_tokens"] == 7 and loop.timing["decode_steps"] == 15


def _logits(loop, seq: torch.Tensor) -> torch.Tensor:
    return torch.stack([torch.from_numpy(r) for r in loop.teacher_forced_logits(seq)]).double()


# Note [KV cache dtype]: with kv_cache="bf16" every K and V value is rounded once as it is written
# and attention reads the cache through flashrt/decode's cache_attention. Layer 0's cache (from
# the embeddings alone) is the f32 loop's rounded; deeper layers and the logits follow up to that
# rounding. Gemma 2 (softcapped scores) and Gemma 3 (per-head q/k norms) run past their sliding
# window of 8.
@pytest.mark.parametrize("make", [hosts.qwen3, hosts.llama, decoder_hosts.gemma2,
                                  decoder_hosts.gemma3])
def test_a_bf16_kv_cache_holds_the_f32_loops_values_rounded(make):
    model = make()
    snap = hosts.snapshot(model)
    exact = S.decode_loop(model, max_len=64)
    half = S.decode_loop(model, max_len=64, kv_cache="bf16")
    assert exact.program.config.cache_dtype == S._core.DType.f32
    assert half.program.config.cache_dtype == S._core.DType.bf16
    assert half.self_check["min_keys_cosine"] >= half.self_check["keys_cosine_floor"]
    seq = hosts.generate(model, hosts.ids(9, seed=4), 24)[:, :-1]  # 32 positions
    a, b = _logits(exact, seq), _logits(half, seq)
    n = seq.shape[1]
    k32, v32 = exact.program.read_cache(0, n)
    k16, v16 = half.program.read_cache(0, n)
    for mine, want in ((k16, k32), (v16, v32)):
        assert torch.equal(torch.from_numpy(mine), torch.from_numpy(want).bfloat16().float())
    for layer in range(1, exact.program.config.layers):
        pairs = zip(half.program.read_cache(layer, n), exact.program.read_cache(layer, n))
        for mine, want in pairs:
            got = torch.from_numpy(mine).double().flatten()
            ref = torch.from_numpy(want).double().flatten()
            assert float(torch.nn.functional.cosine_similarity(got, ref, dim=0)) > 0.9999
    assert float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0)) > 0.9999
    assert (a.argmax(-1) == b.argmax(-1)).double().mean() >= 0.95
    assert teacher_forced_agreement(model, half, seq) >= 0.95
    assert hosts.same_weights(model, snap)


@pytest.mark.parametrize("kv_cache", ["f16", "i8", "float32", "BF16"])
def test_a_kv_cache_dtype_the_loop_does_not_keep_is_refused_by_name(kv_cache):
    model = hosts.qwen3()
    snap = hosts.snapshot(model)
    with pytest.raises(S.Refused, match=f"a KV cache of '{kv_cache}'; the loop keeps f32 or bf16"):
        S.decode_loop(model, max_len=32, kv_cache=kv_cache)
    assert hosts.same_weights(model, snap)


# seated: q and o per layer and the head (k/v are below the keep-at-host count), and the FFNs:
# one fused seat each, or per projection where the ffn op takes no such form (w8a8).
@pytest.mark.parametrize("scheme,floor,seated", [("w8a16_decode", 0.8, 7), ("w4a16_decode", 0.5, 7),
                                                 ("w8a8_decode", 0.8, 11),
                                                 ("w4a8_decode", 0.5, 11)])
def test_the_loop_runs_what_is_attached(scheme, floor, seated):
    model = hosts.qwen3()
    ids = hosts.ids(8, seed=6)
    seq = hosts.generate(model, ids, 24)[:, :-1]
    base = S.decode_loop(model, max_len=64)
    handle = S.auto_swaps(model, lambda: model(ids[:, :1]), scheme=scheme).attach(model)
    loop = S.decode_loop(model, max_len=64)
    calls_before = handle.summary()["guarded_calls"]
    agreement = teacher_forced_agreement(model, loop, seq)
    handle.detach()
    assert loop.seated == seated
    assert loop.weight_bytes < base.weight_bytes
    assert handle.summary()["guarded_calls"] >= calls_before  # the loop reads packs, not modules
    print(f"{scheme}: teacher-forced top-1 agreement {agreement:.3f}")
    assert agreement >= floor


def test_refusals_leave_the_host_untouched():
    model = hosts.qwen3(1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(S.Refused, match=r"a batch of 2 sequences; this loop holds 1 \("
                       r"decode_loop\(model, max_len, batch=2\)\)"):
        S.decode_loop(model, max_len=32).generate(torch.zeros(2, 3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="static window of 16"):
        S.decode_loop(model, max_len=16).generate(hosts.ids(10), 8)
    assert all(torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())


def test_a_sliding_window_shorter_than_the_run_is_computed():
    """Qwen2 with its window switched on from layer 1: the loop attends to the last 6 positions
    there and to all of them on layer 0, exactly as the host does past the window."""
    torch.manual_seed(12)
    cfg = Qwen2Config(vocab_size=hosts.VOCAB, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      use_sliding_window=True, sliding_window=6, max_window_layers=1)
    model = Qwen2ForCausalLM(cfg).eval()
    loop = S.decode_loop(model, max_len=40)
    assert [lc.window for lc in loop.plan.config.layer] == [0, 6]
    ids = hosts.ids(9, seed=4)
    assert torch.equal(loop.generate(ids, 24), hosts.generate(model, ids, 24))


def test_an_unsupported_rotary_form_is_refused_by_name():
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=4,
                      rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})
    with pytest.raises(S.Refused, match="rotary form 'dynamic'"):
        S.decode_loop(LlamaForCausalLM(cfg).eval(), max_len=32)


def test_the_rotated_width_is_the_rotary_module_s_not_the_declared_factor():
    # Llama declares partial_rotary_factor 0.5 but its rotary module ignores it and rotates whole
    # heads (16 frequencies for head_dim 32); the loop reads the width from the module's own
    # frequencies, so it rotates whole heads too. (Phi-4-mini's module does rotate part of each
    # head: test_decode_families.py.)
    torch.manual_seed(13)
    cfg = LlamaConfig(vocab_size=hosts.VOCAB, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, partial_rotary_factor=0.5)
    model = LlamaForCausalLM(cfg).eval()
    loop = S.decode_loop(model, max_len=40)
    assert (loop.plan.config.rotary_dim, loop.plan.config.head_dim) == (32, 32)
    ids = hosts.ids(7, seed=3)
    assert torch.equal(loop.generate(ids, 24), hosts.generate(model, ids, 24))


def test_the_host_graph_carries_typed_facts():
    """Numbers as numbers and enums as enums: what the decode plan reads of a Qwen3 host."""
    graph, _ = S.decode.describe_tree(hosts.qwen3(1))
    c = graph.config
    assert (c.heads, c.kv_heads, c.head_dim, c.intermediate) == (4, 2, 64, 768)
    assert c.dtype == S._core.DType.f32 and c.rope == S._core.RopeKind.default
    assert c.rope_name == "default" and c.sliding_window == 0
    assert c.layer_types == ["full_attention"]
    mods = {m.path: m for m in graph.modules}
    norm = mods["model.layers.0.input_layernorm"].norm
    assert norm.form == S._core.NormForm.rms and norm.eps == pytest.approx(1e-6)
    assert norm.affine and norm.modulation == ""
    assert mods["model.layers.0.self_attn.q_norm"].norm.form == S._core.NormForm.rms
    rotary = mods["model.rotary_emb"].rotary
    assert len(rotary.inv_freq) == 32 and rotary.attention_scaling == 1.0
    assert mods["model.layers.0.mlp"].seated is None


def test_an_interleaved_rotary_is_caught_by_the_keys_it_caches():
    """Ernie 4.5 rotates interleaved pairs (0 and 1, 2 and 3, ...); the loop rotates the halves.
    Its slots, norms and rotary frequencies all look like Llama's, and on random weights its
    logits barely move (cosine 0.9996, every argmax the same): the rotated keys are the witness."""
    cfg = Ernie4_5Config(vocab_size=hosts.VOCAB, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256)
    torch.manual_seed(0)
    model = Ernie4_5ForCausalLM(cfg).eval()
    assert S.decode.plan_decode(model, 32).ok  # the plan cannot see it
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(S.Refused, match=r"the keys cached at layer 0, position \d have cosine"):
        S.decode_loop(model, max_len=32)
    assert all(torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())


def test_the_self_check_figures_are_kept_on_the_loop():
    loop = S.decode_loop(hosts.llama(), max_len=32)
    check = loop.self_check
    assert check["verdict"] == "passed" and check["tokens"] == 8
    assert check["min_cosine"] >= check["cosine_floor"] == 0.999
    assert check["min_keys_cosine"] >= check["keys_cosine_floor"] == 0.99


def test_the_tensors_a_program_reads_cannot_be_replaced_under_it():
    model = hosts.qwen3(1)
    loop = S.decode_loop(model, max_len=32)
    (tensors,) = loop._keep
    head = loop.plan.head
    with pytest.raises(ValueError, match="a program was built from these tensors"):
        tensors.put(head, None, None)
    fresh = S._core.DecodeTensors(loop.plan)
    with pytest.raises(ValueError, match="'model.nowhere' is not a module the decode plan names"):
        fresh.put("model.nowhere", None, None)
    with pytest.raises(ValueError, match="nothing was put for"):
        S._core.make_decode_program(fresh)
    with pytest.raises(ValueError, match="does not fit the window of 32"):
        loop.program.read_cache(0, 33)


def test_a_fused_qkv_projection_is_refused_by_a_binding_that_takes_them_apart():
    # Phi-3's own binding reads it (test_decode_families.py); Llama's names the fused form.
    cfg = Phi3Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=4, pad_token_id=0)
    model = Phi3ForCausalLM(cfg).eval()
    plan = S.decode.plan_decode(model, 32, "llama_decode")
    assert not plan.ok and not plan.fits
    assert "model.layers.0.self_attn.qkv_proj is a fused qkv projection" in plan.refused[0][1]
    assert S.decode.plan_decode(model, 32).binding == "phi3_decode"


def test_a_bf16_host_is_refused():
    model = hosts.qwen3(1).to(torch.bfloat16)
    with pytest.raises(S.Refused, match="host dtype bf16"):
        S.decode_loop(model, max_len=32)


def test_a_norm_form_the_binding_does_not_take_is_refused():
    # Gemma (1) has Llama's slots and norms of the form x*(1+w): Llama's binding takes both
    # forms, OLMo 2's only x*w, so a Gemma layer planned under it is refused by the form.
    plan = S.decode.plan_decode(hosts.gemma(1), 32, "olmo2_decode")
    assert not plan.ok
    assert S.decode.plan_decode(hosts.gemma(1), 32).ok


def test_a_stack_without_the_slots_is_refused():
    with pytest.raises(S.Refused, match="a required slot is absent on this host"):
        S.decode_loop(hosts.gpt2(), max_len=32)


def test_a_scaled_rotary_form_the_host_declares_is_followed():
    # llama3 scaling: the loop takes the host's own (scaled) rotary frequencies.
    cfg = LlamaConfig(vocab_size=hosts.VOCAB, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256,
                      rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64})
    torch.manual_seed(7)
    model = LlamaForCausalLM(cfg).eval()
    ids = hosts.ids(6, seed=8)
    loop = S.decode_loop(model, max_len=40)
    want = hosts.generate(model, ids, 20)
    assert teacher_forced_agreement(model, loop, want[:, :-1]) >= 0.999


def test_the_decode_plan_is_made_in_the_core_and_explained_like_any_plan():
    model = hosts.qwen3(2)
    loop = S.decode_loop(model, max_len=32)
    text = S.explain(loop)
    assert text.startswith("flashrt decode plan: binding llama_decode, 2 layers, hidden 256, "
                           "heads 4/2 x 64, vocab 512, window 32, 0 seated, buildable"), text
    plan = loop.plan
    assert plan.ok and len(plan.layers) == 2
    assert all(lc.qk_norm == S._core.QkNorm.per_head for lc in plan.config.layer)
    assert plan.layers[0].slots["q"] == "model.layers.0.self_attn.q_proj"
    assert plan.layers[0].activation == S._core.Activation.silu
    assert "norms x·w/rms(x) before attention, before the feed-forward" in text
    # A refused stack: the plan says why, site and form, before anything is built.
    from transformers import StableLmConfig, StableLmForCausalLM

    refused = S.decode.plan_decode(StableLmForCausalLM(StableLmConfig(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
        num_attention_heads=4)).eval(), 32)
    assert not refused.ok
    site, why = refused.refused[0]
    assert site == "model.layers.0.input_layernorm" and "computes the norm form" in why
    assert "refused:\n  model.layers.0.input_layernorm" in S.explain(refused)


def test_what_is_attached_is_counted_in_the_decode_plan():
    model = hosts.qwen3(2)
    x = hosts.ids(4)
    handle = S.auto_swaps(model, lambda: model(x), scheme="w8a16_decode",
                          min_seat_weights=0).attach(model)
    try:
        plan = S.decode.plan_decode(model, 32)
        assert plan.ok, S.explain(plan)
        assert plan.seated == 2 * 5 + 1  # q, k, v, o, mlp per layer, and the head
        assert all(layer.mlp_seated for layer in plan.layers)
    finally:
        handle.detach()


@pytest.mark.parametrize("scheme", [None, "w8a16_decode", "w4a16_decode", "w8a8_decode",
                                    "w4a8_decode"])
def test_batched_prefill_computes_what_token_by_token_prefill_does(scheme):
    """A 300-token prompt runs as blocks of 256 and 44 rows (causal inside each; the decode band's
    kernels take a block 16 rows at a time, flashrt/gemm's block forms whole, on AMX on its
    tiles: Note [Prompt blocks]); its last logits and every cached position must match feeding the
    tokens one by one, bit for bit where every kernel's rows are independent of each other."""
    model = hosts.qwen3()
    model.config.max_position_embeddings = 640  # the window the prompt needs
    handle = None
    if scheme is not None:
        handle = S.auto_swaps(model, lambda: model(hosts.ids(1)), scheme=scheme).attach(model)
    try:
        loop = S.decode_loop(model, max_len=320)
        tokens = hosts.ids(300, seed=11)[0].tolist()
        best = loop.program.prefill(tokens, 0)
        blocked = torch.from_numpy(loop.program.logits()).clone()
        after_block = loop.program.step(5, 300)  # reads the cache the blocks wrote
        for pos, tok in enumerate(tokens):
            one = loop.program.step(tok, pos)
        single = torch.from_numpy(loop.program.logits()).clone()
        assert best == one
        assert torch.allclose(blocked, single, rtol=1e-4, atol=1e-4), (blocked - single).abs().max()
        if scheme in ("w8a8_decode", "w4a8_decode"):  # per-row quantization, the same integers
            assert torch.equal(blocked, single)
        assert loop.program.step(5, 300) == after_block
        with pytest.raises(ValueError, match="static window"):
            loop.program.prefill(tokens + tokens, 0)
        with pytest.raises(ValueError, match="vocabulary"):
            loop.program.prefill([1, 2, 10**9], 0)
    finally:
        if handle is not None:
            handle.detach()

"""adopt_prequantized on GGUF files written by gguf's own writer and quantisers (random Llama,
Qwen3 and Gemma 3 hosts; Q4_K and Q6_K as random valid super-blocks), and refusals: corrupt,
truncated, another model's file, unsupported block types."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

import flashrt_structures as S

import gguf_files
import hosts


def llama_gqa() -> LlamaForCausalLM:
    """8 query heads over 2 kv heads: the q/k row permutation differs per tensor."""
    torch.manual_seed(5)
    cfg = LlamaConfig(vocab_size=hosts.VOCAB, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                      max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("make", [llama_gqa, hosts.qwen3], ids=["llama", "qwen3"])
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"])
def test_a_gguf_file_adopts_exactly_and_computes_what_the_host_does(tmp_path, make, qtype):
    model = make()
    path = gguf_files.write(model, tmp_path / "m.gguf", qtype)
    x = hosts.ids(1)
    with torch.no_grad():
        want = model(x).logits
    report = S.adopt_prequantized(model, "gguf", path)
    text = S.explain(report)
    tag = qtype.lower()
    assert f"_{tag} (" in text, text
    # Every seated projection is the file's own blocks: exact, or fp32 rounding of d*q + m (Q5_0's
    # d*(q-16) is exact; the K-quants' f32 scale d*sc and min -dmin*m are, and the product then
    # sum is gguf's own).
    assert report.conversion, text
    exact = qtype in ("Q5_0", "Q4_K", "Q6_K")
    assert report.worst_conversion <= (0.0 if exact else 1e-6), report.conversion
    if qtype in ("Q4_K", "Q6_K"):  # their own forms, near the file's bits a weight
        form = "int4 g32" if qtype == "Q4_K" else "int8 g16"
        assert f"{form} in super-blocks of 256" in text, text
    hosts.computes_then_detaches(report, model, x, want, 0.99999)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q4_K", "Q6_K", "Q5_0", "Q5_1", "Q5_K"])
def test_int8_activations_seat_the_int4_blocks_in_their_integer_dot_forms(tmp_path, qtype):
    """activations="int8": the same blocks laid out for flashrt/gemm's integer dot products
    (Q4_0/Q4_1 as int4_gemm, Q4_K as int4_super_gemm, Q6_K as int6_super_gemm, Q5_0/Q5_1 as
    int5_gemm, Q5_K as int5_super_gemm), the conversion still exact, the plan naming the
    activations' form; the model computes near the host and detaches bit for bit."""
    model = hosts.qwen3()
    path = gguf_files.write(model, tmp_path / "m.gguf", qtype)
    x = hosts.ids(3)
    with torch.no_grad():
        want = model(x).logits
    report = S.adopt_prequantized(model, "gguf", path, activations="int8")
    text = S.explain(report)
    assert not report.plan.refused, text
    exact = qtype in ("Q4_K", "Q6_K", "Q5_0", "Q5_K")
    assert report.conversion and report.worst_conversion <= (0.0 if exact else 1e-6)
    forms = set(report.forms.values())
    assert forms and all(f.endswith("activations int8 per 32") for f in forms), forms
    if qtype == "Q4_K":
        assert forms == {"int4 g32 in super-blocks of 256, 6-bit scale and min codes under f16 "
                         "scales, activations int8 per 32"}, forms
    if qtype == "Q6_K":  # the file's six bits a value
        assert forms == {"int6 g16 in super-blocks of 256, int8 scale codes under f16 scales, "
                         "activations int8 per 32"}, forms
    if qtype.startswith("Q5"):  # five bits a value
        assert all(f.startswith("int5 g32") for f in forms), forms
    seats = {sp.site: sp for sp in report.plan.seats}
    # The gated feed-forward's projections one by one on flashrt/gemm (the fused op reads no
    # integer-dot form).
    gate = seats["model.layers.0.mlp.gate_proj"]
    assert gate.form.name == f"gguf_{qtype.lower()}_a8", text
    assert gate.impl == f"gemm_as_projections_{qtype.lower()}_a8", text
    hosts.computes_then_detaches(report, model, x, want, 0.999)


def test_int8_activations_keep_the_weight_only_forms_of_the_other_block_types(tmp_path):
    """A mix under activations="int8": Q4_K and Q6_K projections take their integer-dot forms,
    a Q8_0 one stays int8 g32 (no integer-dot form) beside them in the same region, seated on
    flashrt/linear while its siblings run on flashrt/gemm, each named in the report."""
    model = hosts.qwen3()
    mix = {"*": "Q4_K", "output.weight": "Q6_K", "blk.0.ffn_down.weight": "Q8_0"}
    report = S.adopt_prequantized(model, "gguf", gguf_files.write(model, tmp_path / "m.gguf", mix),
                                  activations="int8")
    try:
        assert not report.plan.refused, S.explain(report)
        assert report.forms["lm_head"].startswith("int6 g16 in super"), report.forms
        assert report.forms["model.layers.0.mlp.down_proj"] == "int8 g32 f16 scales"
        assert report.worst_conversion <= 1e-6
        assert report.forms["model.layers.1.mlp.down_proj"].endswith("activations int8 per 32")
        seats = {sp.site: sp for sp in report.plan.seats}
        assert seats["model.layers.0.mlp.gate_proj"].package == "flashrt/gemm"
        assert seats["model.layers.0.mlp.down_proj"].package == "flashrt/linear"
        # gate passed flashrt/linear's per-node rung, which does not read its form, on its way.
        gate = seats["model.layers.0.mlp.gate_proj"]
        assert "ffn_as_projections_q4_k_a8: linear" in gate.ladder[-1], gate.ladder
        assert report.forms["model.layers.0.self_attn.q_proj"].endswith("activations int8 per 32")
    finally:
        report.handle.detach()


def test_a_block_type_no_form_reads_is_refused_by_name_with_int8_activations_too(tmp_path):
    """Q2_K has no form at all: refused by name per tensor under int8 activations as under the
    host's, the rest of the file adopted."""
    qtype = {"*": "Q4_K", "blk.0.ffn_down.weight": "Q2_K"}
    model = hosts.qwen3()
    path = gguf_files.write(model, tmp_path / "m.gguf", qtype)
    report = S.adopt_prequantized(model, "gguf", path, activations="int8")
    try:
        refused = dict(report.plan.refused)
        why = refused.get("model.layers.0.mlp.down_proj") or refused.get("model.layers.0.mlp")
        assert why and "blk.0.ffn_down.weight is Q2_K blocks; adoptable:" in why, S.explain(report)
        assert "Q5_K" in why and "Q2_K (" not in why, why
        assert report.forms["model.layers.1.mlp.down_proj"].endswith("activations int8 per 32")
    finally:
        if report.handle is not None:
            report.handle.detach()


def test_activations_outside_the_readers_forms_are_clear_errors(tmp_path):
    model = hosts.qwen3()
    path = gguf_files.write(model, tmp_path / "m.gguf", "Q4_K")
    with pytest.raises(ValueError, match="activations 'fp8'"):
        S.adopt_prequantized(model, "gguf", path, activations="fp8")
    with pytest.raises(ValueError, match="host otherwise"):
        S.adopt_prequantized(model, "compressed-tensors", tmp_path, activations="int8")
    assert not S.attached(model)


def test_a_gemma3_k_quant_file_seats_its_tied_262k_row_head_from_the_embedding(tmp_path):
    """Gemma 3's head is its 262,144-row embedding: a K-quant file holds it once, as
    token_embd (Q6_K, as llama.cpp's Q4_K_M mixes write it), and the head is seated from those
    blocks; the projections are Q4_K in their own form; decode_loop runs over both."""
    torch.manual_seed(23)
    cfg = Gemma3TextConfig(vocab_size=262144, hidden_size=256, intermediate_size=512,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                           head_dim=64, max_position_embeddings=256, sliding_window=8,
                           query_pre_attn_scalar=64,
                           layer_types=["sliding_attention", "full_attention"], pad_token_id=0,
                           bos_token_id=1, eos_token_id=None, tie_word_embeddings=True)
    model = Gemma3ForCausalLM(cfg).eval()
    path = gguf_files.write(model, tmp_path / "g3.gguf",
                            {"*": "Q4_K", "token_embd.weight": "Q6_K"})
    x = hosts.ids(4)
    with torch.no_grad():
        want = model(x).logits
    report = S.adopt_prequantized(model, "gguf", path)
    text = S.explain(report)
    seats = {sp.site: sp for sp in report.plan.seats}
    assert seats["lm_head"].form.name == "gguf_q6_k", text
    assert seats["model.layers.0.mlp"].form.name == "gguf_q4_k", text
    # Gemma 3's layers norm each sublayer's output too: their blocks are another form.
    assert all("decoder_block: form 'other'" in why and "4 norms called" in why
               for _, why in report.plan.refused), text
    assert len(report.plan.refused) == 2 and report.worst_conversion == 0.0, text
    try:
        loop = S.decode_loop(model, max_len=32)
        assert loop.self_check["verdict"] == "passed", loop.self_check
    finally:
        report.handle.detach()
    report = S.adopt_prequantized(model, "gguf", path)
    hosts.computes_then_detaches(report, model, x, want, 0.99999)


def test_a_block_type_no_kernel_reads_is_refused_by_name_per_tensor(tmp_path):
    qtype = {"*": "Q4_0", "blk.0.ffn_down.weight": "Q5_1"}
    with gguf_files.adopted(hosts.qwen3(), tmp_path, qtype) as report:
        refused = dict(report.plan.refused)
        assert "model.layers.0.mlp" in refused, S.explain(report)
        why = refused["model.layers.0.mlp"]
        assert "blk.0.ffn_down.weight is Q5_1 blocks" in why, why
        assert "adopted with activations='int8' (int5_gemm)" in why, why
        seated = {sp.site for sp in report.plan.seats}
        assert "model.layers.1.mlp" in seated  # the other layer's blocks are adopted


def test_unquantised_tensors_in_the_file_stay_with_the_host(tmp_path):
    qtype = {"*": "Q8_0", "output.weight": "F32"}
    with gguf_files.adopted(hosts.qwen3(), tmp_path, qtype) as report:
        kept = dict(report.plan.keep_host)
        assert "lm_head" in kept and "unquantised" in kept["lm_head"], S.explain(report)


def test_a_corrupt_or_truncated_file_is_refused_and_the_host_untouched(tmp_path):
    model = hosts.qwen3()
    path = gguf_files.write(model, tmp_path / "m.gguf", "Q4_1")
    data = path.read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: len(data) // 2])
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    for bad in (truncated, garbage, tmp_path / "missing.gguf"):
        hosts.refuses_adoption(model, "gguf", bad, "adopt")


def test_a_file_for_a_different_model_is_refused_with_the_reason(tmp_path):
    other = hosts.qwen3()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.5)
    path = gguf_files.write(other, tmp_path / "other.gguf", "Q8_0")
    hosts.refuses_adoption(hosts.qwen3(), "gguf", path, "not this checkpoint.s")
    hosts.refuses_adoption(hosts.llama(), "gguf", path, "adopt")  # another architecture's shapes


def test_unknown_formats_and_a_missing_source_are_clear_errors():
    model = hosts.qwen3()
    with pytest.raises(ValueError, match="supported: gguf"):
        S.adopt_prequantized(model, "awq", "x")
    with pytest.raises(ValueError, match="needs source"):
        S.adopt_prequantized(model, "gguf")


@pytest.mark.parametrize("qtype,activations", [("Q5_0", "host"), ("Q4_K", "host"),
                                                ("Q6_K", "host"), ("Q4_K_M", "host"),
                                                ("Q4_K_M", "int8")])
def test_decode_loop_runs_over_adopted_k_quant_blocks_and_passes_its_self_check(tmp_path, qtype,
                                                                                activations):
    """Q4_K and Q6_K are laid out in their own super-block forms, Q5_0 re-expressed in the int8
    g32 form: the decode program takes the adopted packs like any seat's, and its self-check
    against the
    seated host passes; Q4_K_M is llama.cpp's mix (Q6_K for the head, attn_v and half the
    ffn_down, Q4_K for the rest), each projection seated in its own form; with int8 activations
    its Q4_K projections run as integer dot products."""
    model = hosts.qwen3()
    mix: str | dict[str, str] = qtype
    if qtype == "Q4_K_M":
        mix = {"*": "Q4_K", "output.weight": "Q6_K", "blk.0.attn_v.weight": "Q6_K",
               "blk.1.attn_v.weight": "Q6_K", "blk.0.ffn_down.weight": "Q6_K"}
    report = S.adopt_prequantized(model, "gguf",
                                  gguf_files.write(model, tmp_path / "m.gguf", mix),
                                  activations=activations)
    try:
        assert not report.plan.refused and report.worst_conversion == 0.0, S.explain(report)
        a8 = [f for f in report.forms.values() if f.endswith("activations int8 per 32")]
        assert bool(a8) == (activations == "int8"), report.forms
        loop = S.decode_loop(model, max_len=64)
        assert loop.self_check["verdict"] == "passed", loop.self_check
        assert loop.self_check["min_cosine"] >= 0.999, loop.self_check
        prompt = hosts.ids(4)
        out = loop.generate(prompt, 8)
        assert out.shape == (1, 12) and torch.equal(out[:, :4], prompt)
    finally:
        report.handle.detach()

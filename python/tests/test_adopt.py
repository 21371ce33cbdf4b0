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
    assert not report.plan.refused and report.worst_conversion == 0.0, text
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
        assert "blk.0.ffn_down.weight is Q5_1 blocks" in refused["model.layers.0.mlp"]
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


@pytest.mark.parametrize("qtype", ["Q5_0", "Q4_K", "Q6_K", "Q4_K_M"])
def test_decode_loop_runs_over_adopted_k_quant_blocks_and_passes_its_self_check(tmp_path, qtype):
    """Q4_K and Q6_K are laid out in their own super-block forms, Q5_0 re-expressed in the int8
    g32 form: the decode program takes the adopted packs like any seat's, and its self-check
    against the
    seated host passes; Q4_K_M is llama.cpp's mix (Q6_K for the head, attn_v and half the
    ffn_down, Q4_K for the rest), each projection seated in its own form."""
    model = hosts.qwen3()
    mix: str | dict[str, str] = qtype
    if qtype == "Q4_K_M":
        mix = {"*": "Q4_K", "output.weight": "Q6_K", "blk.0.attn_v.weight": "Q6_K",
               "blk.1.attn_v.weight": "Q6_K", "blk.0.ffn_down.weight": "Q6_K"}
    report = S.adopt_prequantized(model, "gguf",
                                  gguf_files.write(model, tmp_path / "m.gguf", mix))
    try:
        assert not report.plan.refused and report.worst_conversion == 0.0, S.explain(report)
        loop = S.decode_loop(model, max_len=64)
        assert loop.self_check["verdict"] == "passed", loop.self_check
        assert loop.self_check["min_cosine"] >= 0.999, loop.self_check
        prompt = hosts.ids(4)
        out = loop.generate(prompt, 8)
        assert out.shape == (1, 12) and torch.equal(out[:, :4], prompt)
    finally:
        report.handle.detach()

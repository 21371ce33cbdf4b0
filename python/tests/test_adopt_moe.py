"""adopt_prequantized on GGUF MoE files written by gguf's own writer (llama.cpp's expert names,
blk.N.ffn_{gate,up,down}_exps): every bank seated with the file's own blocks, per expert, through
transformers' loader's placement (gate and up the halves of gate_up_proj); refusals by name."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

import flashrt_structures as S
from flashrt_structures import _core

import gguf_files
import hosts
import moe_hosts


def banks(report) -> dict[str, _core.SeatPlan]:
    return {s.site: s for s in report.plan.seats if s.seam.structure == "moe_experts"}


def qwen3_moe_narrow() -> Qwen3MoeForCausalLM:
    """moe_hosts.qwen3_moe with half the experts' width: the same names, other bank shapes."""
    torch.manual_seed(10)
    cfg = Qwen3MoeConfig(**moe_hosts._COMMON, head_dim=64, num_hidden_layers=2,
                         intermediate_size=512, moe_intermediate_size=64, num_experts=16,
                         num_experts_per_tok=4)
    return Qwen3MoeForCausalLM(cfg).eval()


def qwen3_moe_wide() -> Qwen3MoeForCausalLM:
    """A Qwen3-MoE host whose experts' widths are whole K-quant super-blocks (256)."""
    torch.manual_seed(12)
    cfg = Qwen3MoeConfig(**moe_hosts._COMMON, head_dim=64, num_hidden_layers=2,
                         intermediate_size=512, moe_intermediate_size=256, num_experts=8,
                         num_experts_per_tok=2)
    return Qwen3MoeForCausalLM(cfg).eval()


@pytest.mark.parametrize("make,qtype,band", [
    (moe_hosts.qwen3_moe, "Q8_0", 0.99999),
    (moe_hosts.qwen3_moe, "Q4_0", 0.99999),
    (moe_hosts.qwen3_moe, "Q4_1", 0.99999),
    (moe_hosts.qwen3_moe, "Q5_0", 0.99999),
    (moe_hosts.qwen2_moe, "Q8_0", 0.99999),
    (moe_hosts.qwen2_moe, "Q4_0", 0.99999),
    (qwen3_moe_wide, "Q4_K", 0.99999),
], ids=["qwen3_moe-Q8_0", "qwen3_moe-Q4_0", "qwen3_moe-Q4_1", "qwen3_moe-Q5_0",
        "qwen2_moe-Q8_0", "qwen2_moe-Q4_0", "qwen3_moe_wide-Q4_K"])
def test_a_gguf_moe_file_seats_every_bank_with_its_own_blocks(tmp_path, make, qtype, band):
    model = make()
    path = gguf_files.write(model, tmp_path / "m.gguf", qtype)
    snap = hosts.snapshot(model)  # the host as loaded: the file's dequantised values
    x = hosts.ids(4, seed=3)
    with torch.no_grad():
        want = model(x).logits
    report = S.adopt_prequantized(model, "gguf", path)
    text = S.explain(report)
    layers = model.config.num_hidden_layers
    seated = banks(report)
    assert len(seated) == layers, text
    tag = qtype.lower()
    for site, sp in seated.items():
        assert sp.op == _core.OpKind.moe_ffn and sp.form.name == f"gguf_{tag}", text
        for op in ("gate", "up", "down"):
            # Each expert's pack is the file's blocks: exact, or fp32 rounding of d*q + m.
            assert report.conversion[f"{site}/{op}"] <= 1e-6, report.conversion
            assert report.forms[f"{site}/{op}"] == sp.form.describe()
    rows = [r for r in report.handle.report() if r["structure"] == "moe_experts"]
    assert len(rows) == layers and all(r["impl"] == f"moe_{tag}" for r in rows), rows
    if model.config.model_type == "qwen2_moe":  # the shared expert: its own Linears, adopted
        sp = {s.site: s for s in report.plan.seats}["model.layers.0.mlp.shared_expert"]
        assert sp.seam.structure == "decoder_ffn" and sp.form.name == f"gguf_{tag}", text
        assert "model.layers.0.mlp.shared_expert.down_proj" in report.conversion
    hosts.computes_then_detaches(report, model, x, want, band)
    assert hosts.same_weights(model, snap)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q5_K", "Q4_0"])
def test_int8_activations_seat_k_quant_banks_on_the_integer_dot_bank(tmp_path, qtype):
    """activations="int8": a K-quant (or Q4_0) file's banks are one gemm_moe seat each in the
    integer-dot form of their blocks (int4_super_gemm, int6_super_gemm, int4_gemm), the
    conversion still exact, computing near the host; the host's weights untouched."""
    model = qwen3_moe_wide()
    path = gguf_files.write(model, tmp_path / "m.gguf", qtype)
    snap = hosts.snapshot(model)
    x = hosts.ids(4, seed=3)
    with torch.no_grad():
        want = model(x).logits
    report = S.adopt_prequantized(model, "gguf", path, activations="int8")
    text = S.explain(report)
    seated = banks(report)
    assert len(seated) == model.config.num_hidden_layers, text
    for site, sp in seated.items():
        assert sp.impl == f"gemm_moe_{qtype.lower()}_a8", text
        assert sp.form.describe().endswith("activations int8 per 32"), text
        for op in ("gate", "up", "down"):
            assert report.conversion[f"{site}/{op}"] <= (0.0 if qtype != "Q4_0" else 1e-6)
    hosts.computes_then_detaches(report, model, x, want, 0.999)
    assert hosts.same_weights(model, snap)


def test_a_bank_tensor_in_a_block_type_no_kernel_reads_is_refused_by_name(tmp_path):
    qtype = {"*": "Q8_0", "blk.0.ffn_down_exps.weight": "Q5_1"}
    with gguf_files.adopted(moe_hosts.qwen3_moe(), tmp_path, qtype) as report:
        refused = dict(report.plan.refused)
        why = refused["model.layers.0.mlp.experts"]
        assert ("model.layers.0.mlp.experts/down: blk.0.ffn_down_exps.weight is Q5_1 blocks"
                in why), why
        assert set(banks(report)) == {"model.layers.1.mlp.experts"}  # the other layer's bank


def test_a_bank_tensor_the_file_holds_unquantised_keeps_the_bank_with_the_host(tmp_path):
    qtype = {"*": "Q8_0", "blk.1.ffn_up_exps.weight": "F16"}
    with gguf_files.adopted(moe_hosts.qwen3_moe(), tmp_path, qtype) as report:
        kept = dict(report.plan.keep_host)
        why = kept["model.layers.1.mlp.experts"]
        assert "holds model.layers.1.mlp.experts/up unquantised" in why, S.explain(report)
        assert set(banks(report)) == {"model.layers.0.mlp.experts"}


def test_a_bank_whose_gate_and_down_differ_in_form_is_refused_with_the_reason(tmp_path):
    model = moe_hosts.qwen3_moe()
    path = gguf_files.write(model, tmp_path / "m.gguf",
                            {"*": "Q8_0", "blk.1.ffn_down_exps.weight": "Q4_0"})
    x = hosts.ids(3, seed=2)
    with torch.no_grad():
        want = model(x).logits
    report = S.adopt_prequantized(model, "gguf", path)
    why = dict(report.plan.refused)["model.layers.1.mlp.experts"]
    assert ("gguf checkpoint holds the bank's gate gguf_q8_0, up gguf_q8_0, down gguf_q4_0; "
            "one bank op runs one form") in why, why
    assert set(banks(report)) == {"model.layers.0.mlp.experts"}
    hosts.computes_then_detaches(report, model, x, want, 0.999)


def test_an_expert_tensor_of_another_shape_refuses_the_adoption(tmp_path):
    other = qwen3_moe_narrow()
    path = gguf_files.write(other, tmp_path / "narrow.gguf", "Q8_0")
    hosts.refuses_adoption(moe_hosts.qwen3_moe(), "gguf", path,
                           r"ffn_\w+_exps.weight as \[16, \d+, \d+\].*"
                           r"not the one the model was loaded from")


def test_one_expert_of_another_checkpoint_refuses_the_adoption_naming_it(tmp_path):
    other = moe_hosts.qwen3_moe()
    with torch.no_grad():
        other.model.layers[1].mlp.experts.down_proj[5].mul_(1.5)
    path = gguf_files.write(other, tmp_path / "other.gguf", "Q8_0")
    model = moe_hosts.qwen3_moe()  # the same model but for that expert, loaded from its file
    gguf_files.write(model, tmp_path / "mine.gguf", "Q8_0")
    hosts.refuses_adoption(model, "gguf", path, r"experts.down_proj \(expert 5's down\) differs "
                                                r"from .*blk.1.ffn_down_exps.weight")


def test_an_expert_tensor_transformers_loader_places_nowhere_is_named(tmp_path):
    """OLMoE: gguf's map names blk.N.ffn_down_exps, but transformers' loader has no processor
    for its banks and puts the tensor on no host tensor; the bank is refused naming it."""
    with gguf_files.adopted(moe_hosts.olmoe(), tmp_path, "Q8_0") as report:
        why = dict(report.plan.refused)["model.layers.0.mlp.experts"]
        assert "blk.0.ffn_down_exps.weight: transformers' GGUF loader" in why, why
        assert "puts it on no tensor of this OlmoeForCausalLM" in why, why
        assert not banks(report)

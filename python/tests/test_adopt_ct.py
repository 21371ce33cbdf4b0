"""adopt_prequantized(fmt='compressed-tensors') on checkpoints the compressed-tensors library
writes itself (random Llama and Qwen3 hosts): from the checkpoint directory with a dense host,
and from the modules transformers loads compressed; refusals: another model's checkpoint,
schemes no kernel reads (named per tensor), corrupt or missing sources."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import flashrt_structures as S

import ct_files
import hosts


def exact(report: S.AdoptionReport, model: torch.nn.Module) -> None:
    """Every seated projection computes the checkpoint's own values: 0, or fp32 rounding."""
    assert report.conversion
    for mpath, err in report.conversion.items():
        w = model.get_submodule(mpath).weight.detach()
        assert err <= 4 * np.finfo(np.float32).eps * float(w.abs().max()), (mpath, err)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


SCHEMES = {
    "int4_group_sym": (ct_files.INT4_GROUP_SYM, None, "int4 g32 symmetric"),
    "int4_group_asym": (ct_files.INT4_GROUP_ASYM, None, "int4 g128 asymmetric"),
    "int4_channel_sym": (ct_files.INT4_CHANNEL_SYM, None, "int4 g128 symmetric"),
    "int8_channel_sym": (ct_files.INT8_CHANNEL_SYM, None, "int8 per-channel"),
    "int8_group_sym": (ct_files.INT8_GROUP_SYM, None, "int8 g64"),
    "int8_tensor_sym": (ct_files.INT8_TENSOR_SYM, None, "int8 per-channel"),
    "int8_channel_int_quantized": (ct_files.INT8_CHANNEL_SYM, "int-quantized", "int8 per-channel"),
}


@pytest.mark.parametrize("make", [hosts.llama, hosts.qwen3], ids=["llama", "qwen3"])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_a_checkpoint_dir_adopts_exactly_onto_the_dense_host(tmp_path, make, scheme):
    weights, fmt, form = SCHEMES[scheme]
    model = make()
    ct_files.write(model, tmp_path / "ckpt", weights, fmt=fmt)
    x = hosts.ids(5)
    with torch.no_grad():
        want = model(x).logits
    report = S.adopt_prequantized(model, "compressed-tensors", tmp_path / "ckpt")
    assert set(report.forms.values()) == {form}, S.explain(report)
    exact(report, model)
    hosts.computes_then_detaches(report, model, x, want, 0.9999)


@pytest.mark.parametrize("scheme", ["int4_group_sym", "int8_channel_sym", "int8_group_sym",
                                    "int8_channel_int_quantized"])
def test_the_packs_a_compressed_load_carries_are_adopted_without_a_source(tmp_path, scheme):
    weights, fmt, form = SCHEMES[scheme]
    dense = hosts.qwen3()
    ct_files.write(dense, tmp_path / "ckpt", weights, fmt=fmt)
    x = hosts.ids(5)
    with torch.no_grad():
        want = dense(x).logits
    for source in (None, tmp_path / "ckpt"):
        model = ct_files.load(tmp_path / "ckpt")  # transformers' own compressed load
        assert not hasattr(model.model.layers[0].mlp.down_proj, "weight") or fmt
        report = S.adopt_prequantized(model, "compressed-tensors", source)
        assert set(report.forms.values()) == {form}, S.explain(report)
        exact(report, model)
        # detached, the library's decompression on the first call is the dense host's values
        hosts.computes_then_detaches(report, model, x, want, 0.9999)


def test_schemes_no_kernel_reads_are_refused_by_name_per_tensor(tmp_path):
    model = hosts.qwen3()
    ct_files.write(model, tmp_path / "ckpt", {
        "re:.*layers\\.0\\.mlp\\.down_proj$": ct_files.FP8_CHANNEL,
        "re:.*layers\\.1\\.mlp\\.down_proj$": ct_files.INT8_CHANNEL_ASYM,
        "re:.*layers\\.0\\.mlp\\.(gate|up)_proj$": dict(ct_files.INT4_GROUP_SYM, group_size=16),
        "re:.*layers\\.1\\.mlp\\.(gate|up)_proj$": ct_files.INT4_GROUP_SYM,
        "re:.*self_attn\\.[qkvo]_proj$": ct_files.INT4_GROUP_SYM,
    })
    report = S.adopt_prequantized(model, "compressed-tensors", tmp_path / "ckpt")
    try:
        refused = dict(report.plan.refused)
        text = S.explain(report)
        mlp0, mlp1 = refused.get("model.layers.0.mlp", ""), refused.get("model.layers.1.mlp", "")
        # the library picks the fp8 tensor's format (naive-quantized in 0.20); its name is the point
        assert "model.layers.0.mlp.down_proj.weight is " in mlp0, text
        assert "float8 channel symmetric; adoptable: int4/int8" in mlp0, text
        assert "no kernel group (128, 64, 32) divides its group of 16" in mlp0, text
        assert "model.layers.1.mlp.down_proj.weight is pack-quantized int8 channel asymmetric" \
            in mlp1 and "carry no zero point" in mlp1, text
        assert "model.layers.1.mlp.gate_proj" not in mlp1  # named per tensor, not per block
        assert report.conversion  # the attention projections are adopted
        assert not any(k.startswith("model.layers.0.mlp") for k in report.conversion)
    finally:
        if report.handle is not None:
            report.handle.detach()


def test_a_checkpoint_for_a_different_model_is_refused_with_the_reason(tmp_path):
    other = hosts.qwen3()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.5)
    ct_files.write(other, tmp_path / "other", ct_files.INT4_GROUP_SYM)
    hosts.refuses_adoption(hosts.qwen3(), "compressed-tensors", tmp_path / "other",
                           "not this checkpoint's")
    hosts.refuses_adoption(hosts.llama(), "compressed-tensors", tmp_path / "other",  # its shapes
                           "not the checkpoint the model was loaded from")


def test_a_corrupt_or_missing_source_is_refused_and_the_host_untouched(tmp_path):
    model = hosts.qwen3()
    good = ct_files.write(model, tmp_path / "ckpt", ct_files.INT8_GROUP_SYM)
    truncated = tmp_path / "truncated"
    shutil.copytree(good, truncated)
    data = (good / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    no_config = tmp_path / "no_config"
    shutil.copytree(good, no_config)
    cfg = json.loads((good / "config.json").read_text())
    del cfg["quantization_config"]
    (no_config / "config.json").write_text(json.dumps(cfg))
    bad_config = tmp_path / "bad_config"
    shutil.copytree(good, bad_config)
    (bad_config / "config.json").write_text("{not json")
    no_tensors = tmp_path / "no_tensors"
    shutil.copytree(good, no_tensors)
    (no_tensors / "model.safetensors").unlink()
    for bad, why in ((truncated, "not a readable safetensors"),
                     (no_config, "no compressed-tensors quantization_config"),
                     (bad_config, "not readable JSON"), (no_tensors, "no .safetensors"),
                     (tmp_path / "missing", "no checkpoint directory")):
        hosts.refuses_adoption(model, "compressed-tensors", bad, why)


def test_a_dense_host_without_a_source_is_a_clear_error():
    model = hosts.qwen3()
    with pytest.raises(ValueError, match="carry no compressed weights"):
        S.adopt_prequantized(model, "compressed-tensors")
    with pytest.raises(ValueError, match="supported: gguf, compressed-tensors"):
        S.adopt_prequantized(model, "awq", "x")


def test_a_bf16_checkpoint_is_adopted_within_the_rounding_of_its_own_dequantisation(tmp_path):
    """bf16 scales: the library dequantises (q - zp) * s in bf16, the seat computes it exactly in
    fp32 from the same bf16 scales, so they differ by bf16 rounding, and no more."""
    dense = hosts.qwen3()
    ct_files.write(dense, tmp_path / "ckpt", ct_files.INT4_GROUP_SYM, dtype=torch.bfloat16)
    x = hosts.ids(5)
    with torch.no_grad():
        want = dense(x).logits
    for model, source in ((dense, tmp_path / "ckpt"), (ct_files.load(tmp_path / "ckpt"), None)):
        report = S.adopt_prequantized(model, "compressed-tensors", source)
        try:
            assert set(report.forms.values()) == {"int4 g32 symmetric"}, S.explain(report)
            for mpath, err in report.conversion.items():
                w = model.get_submodule(mpath).weight.detach().float()
                assert err <= 4 * torch.finfo(torch.bfloat16).eps * float(w.abs().max())
            assert report.worst_conversion > 0  # bf16 rounding, honestly reported
            with torch.no_grad():
                assert cosine(model(x).logits.float(), want) >= 0.9999
        finally:
            report.handle.detach()

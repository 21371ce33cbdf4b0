"""The structure catalog through the installed package: the shipped specs load, say what the
seams are, and a bad catalog fails with the file and field named."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from flashrt_structures import _core, catalog

SHIPPED = ["attention_core", "attention_paged", "attention_sequence", "causal_conv",
           "decoder_block", "decoder_ffn", "encoder_ffn", "gated_delta_core", "linear_proj",
           "lm_head", "modnorm_qkv_chain", "moe_experts", "norm_fused", "qkv_pack",
           "rotary_embed"]


def test_catalog_dir_is_inside_the_installed_package():
    assert catalog.CATALOG_DIR.is_dir()
    assert catalog.CATALOG_DIR.parent.name == "flashrt_structures"
    assert sorted(p.stem for p in (catalog.CATALOG_DIR / "structures").glob("*.yaml")) == SHIPPED
    for policy in ("schemes.yaml", "ladders.yaml", "gates.yaml", "bindings/llama_decode.yaml"):
        assert (catalog.CATALOG_DIR / policy).is_file(), policy


def test_list_structures_names_the_shipped_specs():
    assert catalog.list_structures() == SHIPPED


def test_each_spec_loads_with_a_distinct_digest():
    specs = [catalog.load(name) for name in SHIPPED]
    for name, spec in zip(SHIPPED, specs):
        assert spec.name == name
        assert spec.version == 1
        assert spec.reference
        assert re.fullmatch(r"[0-9a-f]{16}", spec.digest)
        assert spec.gate.min_speedup == pytest.approx(1.02)
        if spec.kind == "function":  # at the host's precision: no weight form, no decode band
            assert name in ("gated_delta_core", "causal_conv", "norm_fused", "attention_core",
                            "attention_paged", "attention_sequence", "rotary_embed")
            rows = spec.dim("rows")
            assert rows is None or not rows.decode_band
            continue
        if spec.kind == "block":  # seated through its parts' seats, decode rows as theirs
            assert name == "decoder_block"
            assert spec.gate.pass_ == pytest.approx(0.99)
        else:
            assert spec.kind == "region"
        rows = spec.dim("rows")
        assert rows is not None and rows.decode_band and (rows.min, rows.max) == (1, 16)
        assert spec.outputs[0].dtype_of == "x"
    assert len({s.digest for s in specs}) == len(SHIPPED)
    assert catalog.shipped() is catalog.shipped()  # loaded once per process


def test_linear_proj():
    spec = catalog.load("linear_proj")
    assert spec.slots == [
        ("weight", ["out_features", "in_features"], True),
        ("bias", ["out_features"], False),
    ]
    assert spec.gate.kind == _core.OutputKind.values
    assert (spec.gate.pass_, spec.gate.warn) == (0.999, 0.995)
    assert spec.points == [("x", "input"), ("y", "output")]
    assert [t.name for t in spec.inputs] == ["x"]
    assert spec.inputs[0].dtypes == [_core.DType.f32, _core.DType.bf16]
    assert not spec.tied_allowed


def test_decoder_ffn():
    spec = catalog.load("decoder_ffn")
    assert [name for name, _, _ in spec.slots] == ["gate", "up", "down"]
    assert all(required for _, _, required in spec.slots)
    assert spec.slot("down").shape == ["hidden", "intermediate"]
    assert spec.slot("bias") is None
    assert spec.attributes == {"activation": ["silu", "gelu_tanh"]}
    assert spec.points == [("x", "input"), ("h", "internal"), ("y", "output")]
    assert spec.boundary_excludes == ["pre_norm", "residual_add"]
    assert [d.name for d in spec.dims] == ["rows", "hidden", "intermediate"]


def test_lm_head():
    spec = catalog.load("lm_head")
    assert spec.tied_allowed
    assert spec.slots == [("weight", ["vocab", "hidden"], True)]
    assert spec.gate.kind == _core.OutputKind.distribution
    assert (spec.gate.pass_, spec.gate.warn) == (0.95, 0.85)


def test_unknown_name_is_a_key_error_listing_the_known_ones():
    with pytest.raises(KeyError,
                       match="sliding_attention.*encoder_ffn, gated_delta_core, linear_proj"):
        catalog.load("sliding_attention")


def test_bad_spec_is_a_value_error_naming_file_and_field(tmp_path: Path):
    (tmp_path / "structures").mkdir()
    spec = tmp_path / "structures" / "linear_proj.yaml"
    shutil.copy(catalog.CATALOG_DIR / "structures" / "linear_proj.yaml", spec)
    spec.write_text(spec.read_text().replace("[f32, bf16], required: true",
                                             "[f32, fp16], required: true"))
    with pytest.raises(ValueError, match=r"linear_proj\.yaml: slots\.weight\.dtypes\[1\]: "
                                         r"unknown dtype 'fp16'"):
        _core.load_catalog(str(tmp_path))


def test_missing_dir_is_a_value_error(tmp_path: Path):
    with pytest.raises(ValueError, match="does not exist"):
        _core.load_catalog(str(tmp_path / "nope"))


def test_a_ladder_naming_a_package_not_on_the_kernel_path_is_refused_at_load(tmp_path: Path):
    shutil.copytree(catalog.CATALOG_DIR, tmp_path / "catalog")
    ladders = tmp_path / "catalog" / "ladders.yaml"
    ladders.write_text(ladders.read_text().replace("package: flashrt/ffn", "package: flashrt/fnn"))
    with pytest.raises(ValueError, match=r"ladders\.yaml: ladders\.decoder_ffn\[0\]\.package: "
                                         r"'flashrt/fnn' is not on the kernel path"):
        catalog.load_catalog(tmp_path / "catalog")

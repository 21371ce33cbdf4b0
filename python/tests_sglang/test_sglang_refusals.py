"""What the SGLang door cannot seat is refused with its reason, and the engine still serves:
another dtype per site, SGLang's fused expert banks by name, the door installed after an engine
started, the plugin excluded; and what SGLang's compiled CPU kernels repacked is never seated
over (Note [The window in SGLang])."""

from __future__ import annotations

import pytest
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from flashrt_structures import sglang_engine

from conftest import SMALL, assert_every_weight_accounted, engine, generate, prompts, save

pytestmark = pytest.mark.usefixtures("door_off")


def test_tensor_parallel_is_refused_in_every_scheduler(qwen3_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_CPU_OMP_THREADS_BIND", "0|1")  # one core per rank (one NUMA node)
    sglang_engine.install(scheme="w8a16_decode")
    with engine(qwen3_dir, tp_size=2) as eng:
        tokens, _ = generate(eng, prompts(1), steps=2)
        reports = sglang_engine.report(eng)
    assert len(tokens[0]) == 2
    assert len(reports) == 2 and len({r["pid"] for r in reports}) == 2
    for rep in reports:
        assert rep["hooked"] and rep["seats"] == 0 and rep["active"]
        sites = dict(rep["refused"])
        assert "model.layers.1.mlp.down_proj" in sites and "lm_head" in sites
        for why in sites.values():
            assert "tensor parallel size 2" in why
        assert_every_weight_accounted(rep, qwen3_dir)


def test_float16_is_refused_per_site_with_its_dtype(qwen3_dir):
    sglang_engine.install(scheme="w8a16_decode")
    with engine(qwen3_dir, dtype="float16") as eng:
        tokens, _ = generate(eng, prompts(1), steps=2)
        (rep,) = sglang_engine.report(eng)
    assert len(tokens[0]) == 2
    assert rep["hooked"] and rep["seats"] == 0 and not rep["error"]
    sites = dict(rep["refused"])
    assert "model.layers.0.self_attn.qkv_proj" in sites and "lm_head" in sites
    assert {f"model.layers.{i}.self_attn.attn" for i in range(2)} <= set(sites)
    for site, why in sites.items():
        if site.endswith(".attn"):  # the attention layers, by their calls' dtype
            assert "attention_paged 4 heads / 2 kv of 64: activations f16" in why, why
        else:
            assert "weight dtype f16" in why, why
    assert_every_weight_accounted(rep, qwen3_dir)


def test_expert_banks_are_refused_by_name_and_the_rest_seated(tmp_path):
    cfg = Qwen3MoeConfig(**{**SMALL, "intermediate_size": 512}, moe_intermediate_size=128,
                         num_experts=8, num_experts_per_tok=2, tie_word_embeddings=False)
    path = save(Qwen3MoeForCausalLM, cfg, tmp_path / "moe", grid=False)
    sglang_engine.install(scheme="w8a16_decode")
    with engine(path) as eng:
        tokens, _ = generate(eng, prompts(1), steps=4)
        (rep,) = sglang_engine.report(eng)
    assert len(tokens[0]) == 4
    banks = {site: why for site, why in rep["refused"] if site.endswith("mlp.experts")}
    assert set(banks) == {"model.layers.0.mlp.experts", "model.layers.1.mlp.experts"}
    for why in banks.values():
        assert "w13_weight [8, 256, 256]" in why and "does not seat expert banks" in why
    seated = {s["site"] for s in rep["seats_report"]}
    assert "lm_head" in seated and "model.layers.1.self_attn.o_proj" in seated
    # Each bank's router stays at host precision: the bank's expert choice stays SGLang's.
    refused = dict(rep["refused"])
    for i in range(2):
        assert f"router of model.layers.{i}.mlp.experts" in refused[f"model.layers.{i}.mlp.gate"]
        assert f"model.layers.{i}.mlp.gate" not in seated
    assert_every_weight_accounted(rep, path)


def test_fp32_logits_keep_the_head_with_sglang(qwen3_dir):
    sglang_engine.install(scheme="w8a16_channel_decode")
    with engine(qwen3_dir, dtype="bfloat16", enable_fp32_lm_head=True) as eng:
        tokens, _ = generate(eng, prompts(1), steps=2)
        (rep,) = sglang_engine.report(eng)
    assert len(tokens[0]) == 2 and not rep["error"]
    refused = dict(rep["refused"])
    assert "enable_fp32_lm_head" in refused["lm_head"]
    seated = {s["site"] for s in rep["seats_report"]}
    assert "lm_head" not in seated and len(seated) == 10  # the linears and attention are seated


def test_install_after_an_engine_started_is_refused(qwen3_dir):
    with engine(qwen3_dir) as eng:
        with pytest.raises(RuntimeError, match="already run in this process"):
            sglang_engine.install(scheme="w8a16_decode")
        sglang_engine.install(scheme="w8a16_decode", allow_started=True)
        (rep,) = sglang_engine.report(eng)  # the running engine says why it has no seats
        assert not rep["hooked"] and "after this engine started" in rep["reason"]
        assert not sglang_engine.attached(eng)


def test_excluded_plugin_is_refused(monkeypatch):
    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else")
    with pytest.raises(RuntimeError, match="SGLANG_PLUGINS='someone_else' does not include"):
        sglang_engine.install(scheme="w8a16_decode")


def test_unknown_scheme_and_structure_are_errors():
    with pytest.raises(ValueError, match="unknown scheme 'w3'"):
        sglang_engine.install(scheme="w3")
    with pytest.raises(KeyError):
        sglang_engine.install(structures=["no_such_structure"])
    assert sglang_engine.hook.request() is None

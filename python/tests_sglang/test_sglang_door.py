"""The SGLang door on real engines: seats in the scheduler process give SGLang's own tokens (on
the int8 grid) and its logits (off it), at concurrency 1 and 8, in float32 and bfloat16; the
scheme "none" is SGLang itself; a second engine in one process is hooked on its own; the ledger
counts the decode steps on the seats and the prefill chunks as band dispatches."""

from __future__ import annotations

import time

import pytest

from flashrt_structures import sglang_engine

from conftest import assert_every_weight_accounted, cosine, engine, generate, prompts

pytestmark = pytest.mark.usefixtures("door_off")

PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
ATTENTION = {f"model.layers.{i}.self_attn.attn" for i in range(2)}  # SGLang's RadixAttention


@pytest.fixture(scope="module")
def plain(qwen3_dir, qwen3_gauss_dir, llama_dir):
    """Plain SGLang's greedy tokens (1 and 8 prompts) and first-step logits, per checkpoint."""
    sglang_engine.uninstall()
    out = {}
    for name, path in (("qwen3", qwen3_dir), ("gauss", qwen3_gauss_dir), ("llama", llama_dir)):
        with engine(path) as eng:
            one, one_logits = generate(eng, prompts(1), logits=True)
            eight, _ = generate(eng, prompts(8, seed=2))
        out[name] = (one, one_logits, eight)
    return out


def _seated_sites(rep: dict) -> set[str]:
    return {s["site"] for s in rep["seats_report"]}


def test_none_is_sglang_itself(qwen3_dir, plain):
    sglang_engine.install(scheme="none")
    with engine(qwen3_dir) as eng:
        tokens, _ = generate(eng, prompts(1))
        (rep,) = sglang_engine.report(eng)
    assert tokens == plain["qwen3"][0]
    assert rep["hooked"] and rep["active"] and rep["seats"] == 0 and not rep["error"]
    # Every projection and the head were planned and kept at host by the scheme, none silent.
    kept = rep["keep_host"]
    assert {f"model.layers.{i}.{p}" for i in range(2) for p in PROJECTIONS} | {"lm_head"} <= set(
        kept)
    assert all("off" in why or "host" in why for why in kept.values())
    assert_every_weight_accounted(rep, qwen3_dir)


@pytest.mark.parametrize("name", ["qwen3", "llama"])
def test_w8_seats_give_sglangs_tokens_at_1_and_8(name, request, plain):
    path = request.getfixturevalue(f"{name}_dir")
    sglang_engine.install(scheme="w8a16_channel_decode")
    with engine(path) as eng:
        one, _ = generate(eng, prompts(1))
        eight, _ = generate(eng, prompts(8, seed=2))
        (rep,) = sglang_engine.report(eng)
    assert rep["hooked"] and rep["active"] and not rep["error"], rep
    layers = {f"model.layers.{i}.{p}" for i in range(2) for p in PROJECTIONS}
    assert _seated_sites(rep) == layers | ATTENTION | {"lm_head"}  # the tied Llama head too
    assert rep["refused"] == []
    assert_every_weight_accounted(rep, path)
    assert one == plain[name][0] and eight == plain[name][2]
    summary = rep["summary"]
    assert summary["fallbacks"] == 0 and summary["clean"]
    assert summary["guarded_calls"] > 0  # decode steps ran on the seats
    assert summary["band_dispatches"] > 0  # prefill chunks (18..40 rows) went to SGLang's path
    assert rep["pid"] != __import__("os").getpid()  # in the scheduler process
    # Each weight seat's band, measured on the first rows it served against SGLang's own layer;
    # an attention seat's call is not one tensor.
    assert set(rep["accuracy"]) == _seated_sites(rep)
    for site in ATTENTION:
        assert rep["accuracy"].pop(site)["band"] is None
    for site, band in rep["accuracy"].items():
        assert band["source"] == "served calls", (site, band)
        assert band["band"] == "pass" and band["rows"] >= 16, (site, band)


def test_w8_off_grid_logits_cosine(qwen3_gauss_dir, plain):
    sglang_engine.install(scheme="w8a16_decode")
    with engine(qwen3_gauss_dir) as eng:
        tokens, logits = generate(eng, prompts(1), logits=True)
        (rep,) = sglang_engine.report(eng)
    assert rep["seats"] == 11
    assert cosine(logits[0], plain["gauss"][1][0]) >= 0.999
    assert tokens[0][:1] == plain["gauss"][0][0][:1]


def test_bfloat16_engine_seats(qwen3_gauss_dir):
    sglang_engine.uninstall()
    with engine(qwen3_gauss_dir, dtype="bfloat16") as eng:
        _, base = generate(eng, prompts(1), steps=2, logits=True)
    sglang_engine.install(scheme="w8a16_decode")
    with engine(qwen3_gauss_dir, dtype="bfloat16") as eng:
        _, seated = generate(eng, prompts(1), steps=2, logits=True)
        (rep,) = sglang_engine.report(eng)
    assert rep["seats"] == 11 and rep["summary"]["fallbacks"] == 0
    assert cosine(seated[0], base[0]) >= 0.99


def test_alternates_switch_in_one_engine(qwen3_dir, plain):
    sglang_engine.install(scheme="w8a16_channel_decode", alternates=["w4a8_all"])
    with engine(qwen3_dir) as eng:
        (rep,) = sglang_engine.report(eng)
        assert rep["built"] == ["w4a8_all", "w8a16_channel_decode"]
        (host,) = sglang_engine.select(eng, None)
        assert host["seats"] == 0 and host["scheme"] is None
        tokens, _ = generate(eng, prompts(1))
        assert tokens == plain["qwen3"][0]  # the host alone is SGLang, bit for bit
        (w4,) = sglang_engine.select(eng, "w4a8_all")
        assert w4["seats"] == 11 and w4["scheme"] == "w4a8_all"
        generate(eng, prompts(1), steps=2)
        with pytest.raises(RuntimeError, match="no seat set 'w8a8_all' was built"):
            sglang_engine.select(eng, "w8a8_all")


def test_second_engine_in_one_process_is_hooked_on_its_own(qwen3_dir, llama_dir, plain):
    sglang_engine.install(scheme="w8a16_channel_decode")
    with engine(qwen3_dir) as first, engine(llama_dir) as second:
        a, _ = generate(first, prompts(1))
        b, _ = generate(second, prompts(1))
        (ra,) = sglang_engine.report(first)
        (rb,) = sglang_engine.report(second)
        assert sglang_engine.attached(first) and sglang_engine.attached(second)
    assert a == plain["qwen3"][0] and b == plain["llama"][0]
    assert ra["pid"] != rb["pid"] and ra["seats"] == rb["seats"] == 11


def test_receipt_is_saved(qwen3_dir, tmp_path):
    sglang_engine.install(scheme="w8a16_decode")
    with engine(qwen3_dir) as eng:
        generate(eng, prompts(1), steps=2)
        path = sglang_engine.save_receipt(eng, tmp_path / "r")
    import json
    data = json.loads(path.read_text())
    assert data["door"] == "sglang_engine"
    (worker,) = data["measurements"]["workers"]
    assert worker["hooked"] and worker["active"] and worker["scheme"] == "w8a16_decode"
    assert worker["ledger"] and worker["plan"]


def wait_for_flush(eng, tries: int = 100) -> bool:
    """SGLang's cache flush, retried while a finished request is still being retired."""
    for _ in range(tries):
        if eng.flush_cache().success:
            return True
        time.sleep(0.1)
    return False


def test_weight_update_detaches_the_seats(qwen3_dir, qwen3_gauss_dir, plain):
    """SGLang's weight update writes new values into the host's parameters; the seats held packed
    copies of the old ones, so they are dropped first and the host serves the new weights."""
    sglang_engine.install(scheme="w8a16_channel_decode")
    with engine(qwen3_dir) as eng:
        before, _ = generate(eng, prompts(1))
        result = eng.update_weights_from_disk(str(qwen3_gauss_dir))
        if not result[0] and "cache was not flushed" in result[1]:
            # SGLang had not yet retired the request just served: the weights are the new ones,
            # and the flush of the old weights' cache is SGLang's own, retried until idle.
            result = (wait_for_flush(eng), *result[1:])
        after, _ = generate(eng, prompts(1))
        (rep,) = sglang_engine.report(eng)
    assert before == plain["qwen3"][0]
    assert result[0], result  # SGLang's own answer: the update succeeded
    assert rep["seats"] == 0 and rep["built"] == [] and "updated the weights" in rep["detached"]
    assert after == plain["gauss"][0]  # the host alone, on the new weights


def test_attention_seats_serve_the_decode_batches_in_one_call(qwen3_dir, plain):
    """Each RadixAttention layer's decode batch runs on its seat over SGLang's own pool (the
    backend's per-request gathers gone); the prompts' extend batches are SGLang's, counted as band
    dispatches; the tokens are SGLang's at 1 and 8 prompts (float32, the int8 grid)."""
    sglang_engine.install(scheme="w8a16_channel_decode", structures=["attention_paged"])
    with engine(qwen3_dir) as eng:
        one, _ = generate(eng, prompts(1))
        eight, _ = generate(eng, prompts(8, seed=2))
        (rep,) = sglang_engine.report(eng)
    assert rep["hooked"] and not rep["error"], rep
    assert _seated_sites(rep) == ATTENTION, rep["explain"]
    assert one == plain["qwen3"][0] and eight == plain["qwen3"][2]
    for seat in rep["seats_report"]:
        assert seat["structure"] == "attention_paged" and seat["impl"] == "paged_attention_f32"
        # 2 generate calls of 16 steps: 15 decode batches each, every one on the seat.
        assert seat["calls"] - seat["band_dispatches"] >= 30, seat
        assert seat["fallbacks"] == 0 and seat["band_dispatches"] >= 2, seat


def test_bfloat16_attention_seats_match_sglangs_logits(qwen3_gauss_dir):
    sglang_engine.uninstall()
    with engine(qwen3_gauss_dir, dtype="bfloat16") as eng:
        base_tokens, base = generate(eng, prompts(4, seed=3), steps=4, logits=True)
    sglang_engine.install(scheme="w8a16_decode", structures=["attention_paged"])
    with engine(qwen3_gauss_dir, dtype="bfloat16") as eng:
        tokens, seated = generate(eng, prompts(4, seed=3), steps=4, logits=True)
        (rep,) = sglang_engine.report(eng)
    assert _seated_sites(rep) == ATTENTION and rep["summary"]["fallbacks"] == 0, rep
    assert all(s["impl"] == "paged_attention_bf16" for s in rep["seats_report"])
    for a, b in zip(seated, base, strict=True):
        assert cosine(a, b) >= 0.999
    assert [t[:1] for t in tokens] == [t[:1] for t in base_tokens]


def test_attention_layers_the_op_does_not_compute_are_form_other():
    """Read from real RadixAttention layers: a sliding window, a logit cap the torch-native
    backend ignores, value heads of another size and cross attention each name themselves."""
    from sglang.srt.layers.radix_attention import RadixAttention

    from flashrt_structures import _core
    from flashrt_structures.sglang_engine import attention

    plain_layer = RadixAttention(16, 128, 128 ** -0.5, 8, layer_id=0)
    facts = attention.facts_of(plain_layer)
    assert facts.form == _core.AttentionForm.softmax and facts.cache == _core.AttentionCache.paged
    assert (facts.heads, facts.kv_heads, facts.head_dim) == (16, 8, 128)
    cases = [
        (dict(sliding_window_size=4096), "a sliding window of 4096"),
        (dict(logit_cap=30.0), "a logit cap of 30.0 (the torch-native backend ignores it)"),
        (dict(v_head_dim=64), "value heads of 64 against q/k heads of 128"),
        (dict(is_cross_attention=True), "cross attention"),
    ]
    for kwargs, why in cases:
        facts = attention.facts_of(RadixAttention(16, 128, 128 ** -0.5, 8, layer_id=0, **kwargs))
        assert facts.form == _core.AttentionForm.other and why in facts.other, (kwargs, facts.other)

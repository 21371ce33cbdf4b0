"""qkv_pack and modnorm_qkv_chain on the real diffusers DiT classes (PixArt, SD3, Flux, Wan).

qkv_pack: sibling projections of one input become one seat (one quantization, one GEMM over the
stacked weights); the host's attention code calls them one by one, so the first called computes
all and the others are handed their columns only when called with that very tensor (Note
[Packed seats] in seats.py); any other call runs the projection's own module, counted.
modnorm_qkv_chain: discovered from what the forward computed (the projections' input is a
per-channel affine function of a no-affine norm's output), refused with the form and shape where
no module boundary holds it, and never found on a host without modulation."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from test_diffusers import SCHEME, cosine, host, param_bytes, sample  # noqa: F401 (host: fixture)
from torch import nn

import flashrt_structures as S
from flashrt_structures.seats import PackLead, PackMember

import dit_hosts


def packs(plan) -> list:
    return [sp for sp in plan.seams if len(sp.replaces) > 1]


def attached_step(plan, model: nn.Module, step) -> tuple[torch.Tensor, dict, dict]:
    """One step with the plan attached: its output, the report by site and the summary."""
    handle = plan.attach(model)
    try:
        with torch.no_grad():
            got = sample(step())
        return got, {r["site"]: r for r in handle.report()}, handle.summary()
    finally:
        handle.detach()


@pytest.mark.slow
def test_siblings_of_one_input_are_packed_in_call_order(host):
    name, model, _, _, plan = host
    found = packs(plan)
    assert found, S.explain(plan)
    for sp in found:
        assert sp.seam.structure == "qkv_pack" and sp.impl.startswith("gemm_pack")
        mods = [model.get_submodule(p) for p in sp.replaces]
        assert len({m.in_features for m in mods}) == 1
        assert isinstance(plan.swaps[sp.replaces[0]], PackLead)
        assert all(isinstance(plan.swaps[p], PackMember) for p in sp.replaces[1:])
        form = plan.swaps[sp.replaces[0]].seat.form
        assert list(form.splits) == [m.out_features for m in mods]
        assert form.out == sum(m.out_features for m in mods)
    leads = {sp.replaces[0].rsplit(".", 1)[1] for sp in found}
    # The host calls q before k and v, and the added q before the added k/v (joint attention):
    # the lead is the first called, whatever the modules' registration order.
    assert leads <= {"to_q", "to_k", "add_q_proj"}, leads
    assert "one GEMM for" in S.explain(plan)


def test_joint_attention_packs_its_added_projections_led_by_the_first_called():
    # diffusers registers add_k_proj, add_v_proj before add_q_proj and calls add_q_proj first.
    model, step = dit_hosts.sd3(layers=1, text=40)
    with torch.no_grad():
        want = sample(step())
    plan = S.auto_swaps(model, step, scheme=SCHEME)
    added = [sp for sp in packs(plan) if "add_" in sp.replaces[0]]
    assert added, S.explain(plan)
    for sp in added:
        assert [p.rsplit(".", 1)[1] for p in sp.replaces] == ["add_q_proj", "add_k_proj",
                                                              "add_v_proj"]
    got, report, _ = attached_step(plan, model, step)
    assert cosine(got, want) >= 0.999
    for sp in added:
        assert all(report[p]["calls"] == 1 and report[p]["fallbacks"] == 0 for p in sp.replaces)


@pytest.mark.parametrize("name", ["pixart", "wan"])
def test_cross_attention_packs_only_k_and_v_and_leaves_q_alone(name):
    # 40 text tokens, so the text-side projections see calls inside the GEMM form's band.
    model, step = dit_hosts.FAMILIES[name](layers=1, text=40)
    with torch.no_grad():
        want = sample(step())
    plan = S.auto_swaps(model, step, scheme=SCHEME)
    attn2 = [p for p, m in model.named_modules() if p.endswith("attn2")]
    assert attn2
    by_site = {sp.site: sp for sp in packs(plan)}
    for a in attn2:
        sp = by_site[a]
        assert [p.rsplit(".", 1)[1] for p in sp.replaces] == ["to_k", "to_v"], sp.replaces
        assert plan.swaps[f"{a}.to_q"].seat.form.structure == "linear_proj"
    got, _, summary = attached_step(plan, model, step)
    assert summary["fallbacks"] == 0
    assert cosine(got, want) >= 0.999


def test_attached_step_matches_the_host_and_members_take_their_columns(host):
    name, model, step, want, plan = host
    before = param_bytes(model)
    got, report, _ = attached_step(plan, model, step)
    assert cosine(got, want) >= 0.999, (name, cosine(got, want))
    for sp in packs(plan):
        lead, *members = sp.replaces
        assert report[lead]["calls"] > report[lead]["band_dispatches"], report[lead]
        for m in members:
            r = report[m]
            assert r["calls"] == report[lead]["calls"] and r["fallbacks"] == 0, r
    with torch.no_grad():
        assert torch.equal(sample(step()), want)
    assert param_bytes(model) == before
    for sp in packs(plan):  # the host's own modules are back
        assert all(type(model.get_submodule(p)) is nn.Linear for p in sp.replaces)


@pytest.mark.slow
def test_scheme_none_and_weight_only_schemes_do_not_pack(host):
    _, model, step, want, _ = host
    none = S.auto_swaps(model, step, scheme="none")
    assert none.swaps == {} and not packs(none)
    assert not any("qkv_pack" in why for why in none.notes["scheme"]["keep_host"].values())
    with torch.no_grad():
        assert torch.equal(sample(step()), want)


def test_a_pack_asked_for_by_name_under_a_scheme_without_its_form_says_why(host):
    _, model, step, _, _ = host
    plan = S.auto_swaps(model, step, structures=["qkv_pack", "linear_proj"],
                        scheme="w8a8_decode")
    assert not packs(plan)
    assert ("qkv_pack: scheme 'w8a8_decode' gives it no form; its modules go to the structures "
            "below it") in plan.core.assumed


def _pack_of(plan, members: int = 3):
    return next(sp for sp in packs(plan) if len(sp.replaces) == members)


def test_sibling_calls_off_the_lead_run_their_own_module_and_are_counted():
    model, step = dit_hosts.pixart(layers=1)
    plan = S.auto_swaps(model, step, scheme=SCHEME)
    sp = _pack_of(plan)
    lead_p, k_p, v_p = sp.replaces
    lead, k, v = (plan.swaps[p] for p in sp.replaces)
    hosts = [model.get_submodule(p) for p in sp.replaces]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 256, hosts[0].in_features, generator=g)
    other = x.clone()
    handle = plan.attach(model)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            q_out = lead(x)
            k_out = k(x)  # handed over: the lead's GEMM computed it
            assert cosine(k_out, hosts[1](x)) >= 0.999 and not torch.equal(k_out, hosts[1](x))
            # Another tensor with the same values: not the lead's input, so the host's own answer.
            assert torch.equal(v(other), hosts[2](other))
            # Its columns are still waiting for the lead's input itself.
            assert cosine(v(x), hosts[2](x)) >= 0.999
            # Called again on the same input: its columns were taken, the host serves it.
            assert torch.equal(k(x), hosts[1](x))
            # Called alone (the lead has not run on this tensor).
            y = torch.randn(1, 256, hosts[0].in_features, generator=g)
            assert torch.equal(k(y), hosts[1](y))
            # The input changed in place after the lead ran.
            lead(x)
            x.mul_(2.0)
            assert torch.equal(k(x), hosts[1](x))
            # From a second thread.
            lead(y)
            box = {}
            t = threading.Thread(target=lambda: box.setdefault("v", v(y)))
            t.start()
            t.join()
            assert torch.equal(box["v"], hosts[2](y))
            assert q_out.shape[-1] == hosts[0].out_features
        lk, lv = k.seat.ledger, v.seat.ledger
        reasons = " | ".join([*lk.reasons, *lv.reasons])
        assert lk.fallbacks == 3 and lv.fallbacks == 2, reasons
        assert "another tensor" in reasons and "already took" in reasons, reasons
        assert "in place" in reasons and "thread" in reasons, reasons
        assert handle.summary()["fallbacks"] == 5
    finally:
        handle.detach()


def test_a_lead_that_runs_the_host_sends_its_siblings_to_theirs():
    model, step = dit_hosts.pixart(layers=1)
    plan = S.auto_swaps(model, step, scheme=SCHEME)
    sp = _pack_of(plan)
    lead, k, _ = (plan.swaps[p] for p in sp.replaces)
    hosts = [model.get_submodule(p) for p in sp.replaces]
    x = torch.randn(1, 256, hosts[0].in_features)
    handle = plan.attach(model)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            lead(x)  # leaves k's columns for x
            lead.train()
            assert torch.equal(lead(x), hosts[0](x))  # training mode: the host, and no columns
            lead.eval()
            assert torch.equal(k(x), hosts[1](x))
            few = x[:, : lead.seat.form.band_min - 1]
            assert torch.equal(lead(few), hosts[0](few))  # band dispatch
            assert torch.equal(k(few), hosts[1](few))
        assert k.seat.ledger.fallbacks == 1 and k.seat.ledger.band_dispatches == 1
    finally:
        handle.detach()


# ---- modnorm_qkv_chain -------------------------------------------------------------------------

FORMS = {
    # The modulation is code in the block's forward, from the block's own table.
    "pixart": r"in transformer_blocks\.0\.forward from scale_shift_table \[6, 512\]",
    "wan": r"in blocks\.0\.forward from scale_shift_table \[1, 6, 512\]",
    # A module computes norm and modulation and returns them with the residual gates.
    "sd3": r"in transformer_blocks\.0\.norm1\.forward from transformer_blocks\.0\.norm1\.linear "
           r"\[3072x512\], which returns it with 4 more tensors",
    "flux": r"in transformer_blocks\.0\.norm1\.forward from transformer_blocks\.0\.norm1\.linear "
            r"\[3072x512\], which returns it with 4 more tensors",
}


def test_modnorm_chain_is_found_and_refused_with_its_form_and_shape(host):
    import re
    name, model, _, _, plan = host
    chains = [(site, why) for site, why in plan.notes["refused"]
              if why.startswith("modnorm_qkv_chain")]
    assert chains, S.explain(plan)
    text = " || ".join(why for _, why in chains)
    assert re.search(FORMS[name], text), text
    assert all("no module boundary holds norm\u2192modulation\u2192q/k/v" in why
               and "[512x512]" in why for _, why in chains), text
    assert "modnorm_qkv_chain" in S.explain(plan)
    # One refusal per chain (per modulated norm), at the norm's module: never silence, no repeats.
    assert len({site for site, _ in chains}) == len(chains)
    blocks = {p for p, m in model.named_modules()
              if hasattr(m, "attn") or hasattr(m, "attn1")}
    assert len(chains) >= len(blocks), (chains, blocks)
    # The chain's q/k/v keep their own seats: the self-attention packs.
    for _site, why in chains:
        attn = re.search(r" in ([\w.]+)\), so", why).group(1)
        assert any(sp.site == attn for sp in packs(plan)), (attn, S.explain(plan))


def test_modnorm_chain_is_refused_on_the_attached_handle_too(host):
    _, model, _, _, plan = host
    handle = plan.attach(model)
    try:
        assert any(why.startswith("modnorm_qkv_chain") for _, why in handle.notes["refused"])
    finally:
        handle.detach()


def test_a_block_without_modulation_yields_no_chain():
    from diffusers.models.attention import BasicTransformerBlock
    torch.manual_seed(5)
    block = BasicTransformerBlock(512, 8, 64, norm_type="layer_norm").eval()
    x = torch.randn(1, 64, 512)
    plan = S.auto_swaps(block, lambda: block(x), scheme=SCHEME)
    assert not any("modnorm" in why for _, why in plan.notes["refused"]), S.explain(plan)
    assert "modnorm" not in S.explain(plan)
    assert packs(plan)  # its q/k/v still pack


def test_an_encoder_without_modulation_yields_no_chain_and_packs_its_qkv():
    from transformers import BertConfig, BertModel
    torch.manual_seed(6)
    model = BertModel(BertConfig(vocab_size=1000, hidden_size=512, num_hidden_layers=2,
                                 num_attention_heads=8, intermediate_size=1024)).eval()
    ids = torch.randint(0, 1000, (1, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).last_hidden_state
    plan = S.auto_swaps(model, lambda: model(ids), scheme=SCHEME)
    assert not any("modnorm" in why for _, why in plan.notes["refused"]), S.explain(plan)
    assert len(packs(plan)) == 2, S.explain(plan)  # q/k/v of each layer
    handle = plan.attach(model)
    try:
        with torch.no_grad():
            got = model(ids).last_hidden_state
        assert handle.summary()["fallbacks"] == 0
    finally:
        handle.detach()
    assert cosine(got, want) >= 0.999
    with torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, want)


def test_decode_loop_over_an_attached_pack_reads_the_hosts_projections():
    # The loop reads each slot's tensor or seat; a pack's core seat holds several projections,
    # so the loop takes the host's own weights there (and counts them as not seated).
    import hosts
    model = hosts.qwen3()
    ids = hosts.ids(40, seed=1)
    base = S.decode_loop(model, max_len=64)
    every = [s for s in S.list_structures() if s != "qkv_pack"]
    per_proj = S.auto_swaps(model, lambda: model(ids), scheme=SCHEME, structures=every)
    plan = S.auto_swaps(model, lambda: model(ids), scheme=SCHEME)
    assert len(packs(plan)) == 2
    # The pack modules the per-projection plan seated (k/v alone are below the seat weight count).
    in_packs = sum(1 for sp in packs(plan) for m in sp.replaces if m in per_proj.swaps)
    assert in_packs >= 2
    for p in (per_proj, plan):
        handle = p.attach(model)
        try:
            loop = S.decode_loop(model, max_len=64)  # built and self-checked against the host
            if p is plan:
                assert loop.seated == seated_without_packs - in_packs  # noqa: F821 (set first)
            else:
                seated_without_packs = loop.seated  # noqa: F841 (read on the next turn)
        finally:
            handle.detach()
    assert base.seated == 0

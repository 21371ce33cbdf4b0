"""explain() on real hosts: entries that differ only by the layer index are one line with the
index set and the count (Note [Explain groups] in core/src/util/explain_groups.cpp), the header's
counts are the same, and ``verbose=True`` lists each entry on its own line."""

from __future__ import annotations

import re

import torch

import flashrt_structures as S

import gguf_files
import hosts


def lines(text: str) -> list[str]:
    return [ln[2:] for ln in text.splitlines() if ln.startswith("  ") and not ln.startswith("   ")]


def one(text: str, start: str) -> str:
    found = [ln for ln in lines(text) if ln.startswith(start)]
    assert len(found) == 1, (start, text)
    return found[0]


def counted(text: str, section: str) -> int:
    """The entries a section's lines stand for: xN for a group, 1 for a line of its own."""
    body = text.split(f"\n{section}:\n")[1].split("\n\n")[0].splitlines()
    return sum(int(m.group(1)) if (m := re.search(r"  x(\d+)$", ln)) else 1
               for ln in body if not ln.startswith("   "))


def relu_in_layer_2():
    """A 4-layer Qwen3 whose layer 2 computes relu: its MLP is refused as a region and its
    projections seated one by one, the other MLPs stay one seat each."""
    model = hosts.qwen3(4)
    model.model.layers[2].mlp.act_fn = torch.nn.ReLU()
    x = hosts.ids(4)
    return S.auto_swaps(model, lambda: model(x), scheme="w8a16_decode", min_seat_weights=0)


def test_layers_differing_only_by_index_are_one_line_with_the_set_and_count():
    plan = relu_in_layer_2()
    grouped, verbose = S.explain(plan), S.explain(plan, verbose=True)
    assert grouped.splitlines()[0] == verbose.splitlines()[0] == (
        "flashrt plan: scheme w8a16_decode, 49 seams found, 48 seated, 1 kept at host, 1 refused")
    # Contiguous: the q projections of all four layers, the text of layer 0's line otherwise.
    q0 = one(verbose, "model.layers.0.self_attn.q_proj  ")
    assert one(grouped, "model.layers.{0..3}.self_attn.q_proj  ") == (
        q0.replace("model.layers.0.", "model.layers.{0..3}.", 1) + "  x4")
    # Non-contiguous: layer 2's MLP is not a decoder_ffn seat.
    mlp = one(grouped, "model.layers.{0..1,3}.mlp  ")
    assert "decoder_ffn" in mlp and "-> ffn_w8g64a16" in mlp and mlp.endswith("  x3")
    # A different reason is not merged, and a single member is printed without braces.
    refused = one(grouped, "model.layers.2.mlp  ")
    assert refused == one(verbose, "model.layers.2.mlp  ")
    assert "activation 'relu' outside {silu, gelu_tanh}" in refused
    assert one(grouped, "model.layers.2.mlp.gate_proj  ") == one(verbose,
                                                                 "model.layers.2.mlp.gate_proj  ")
    assert "the verbose form lists each" in grouped
    # Layer 2's block is not assembled, its feed-forward being the host's; the others are.
    assert "not every part has a seat (ffn model.layers.2.mlp)" in one(grouped, "model.layers.2  ")
    assert one(grouped, "model.layers.{0..1,3}  decoder_block ").endswith("  x3")
    # Every entry is counted: the x-counts and the single lines add up to the seats.
    assert counted(grouped, "seated") == counted(verbose, "seated") == len(plan.seams) == 48
    assert counted(grouped, "refused") == 1


def test_verbose_lists_every_seat_one_per_line():
    plan = relu_in_layer_2()
    verbose = S.explain(plan, verbose=True)
    seated = verbose.split("seated:\n")[1].split("\n\n")[0]
    sites = [ln.split("  ")[1] for ln in seated.splitlines()]
    assert sorted(sites) == sorted(sp.site for sp in plan.seams)
    assert "{0.." not in verbose and "the verbose form" not in verbose
    assert S.explain(plan.core, verbose=True) == verbose  # the core Plan explains the same


def test_an_adoption_report_is_grouped_too(tmp_path):
    model = hosts.qwen3(3)
    report = S.adopt_prequantized(model, "gguf", gguf_files.write(model, tmp_path / "m.gguf",
                                                                  "Q8_0"))
    try:
        grouped, verbose = S.explain(report), S.explain(report, verbose=True)
        mlp = one(grouped, "model.layers.{0..2}.mlp  decoder_ffn ")
        assert "-> ffn_q8_0 (" in mlp and mlp.endswith("  x3")
        for i in range(3):
            assert one(verbose, f"model.layers.{i}.mlp  ").startswith(
                f"model.layers.{i}.mlp  decoder_ffn ")
        assert counted(grouped, "seated") == counted(verbose, "seated") == len(report.plan.seats)
        assert len(lines(grouped)) < len(lines(verbose))
    finally:
        if report.handle is not None:
            report.handle.detach()


def test_a_decode_plan_takes_verbose_and_keeps_its_header():
    loop = S.decode_loop(hosts.qwen3(2), max_len=32)
    grouped, verbose = S.explain(loop), S.explain(loop, verbose=True)
    head = ("flashrt decode plan: binding llama_decode, 2 layers, hidden 256, heads 4/2 x 64, "
            "vocab 512, window 32, 0 seated, buildable")
    assert grouped.startswith(head) and verbose.startswith(head)
    refused = S.decode.plan_decode(hosts.gemma(2), 32, "olmo2_decode")
    site = refused.refused[0][0]
    assert site == "model.layers.0.post_feedforward_layernorm"
    assert one(S.explain(refused, verbose=True), site + "  ") == one(S.explain(refused),
                                                                      site + "  ")

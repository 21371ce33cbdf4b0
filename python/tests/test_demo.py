"""The main job's measurement: the host's prefill and decode are timed apart from generate()'s
streamer calls, which holds only if generate puts the prompt first and then each new token as
it comes; and the table it prints."""

from __future__ import annotations

import torch

from flashrt_structures import demo

import hosts


def test_generate_puts_the_prompt_then_each_new_token_to_the_streamer():
    model = hosts.qwen3(2)
    ids = hosts.ids(7)
    stamps = demo._Stamps()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                             streamer=stamps)
    new = out.shape[1] - ids.shape[1]
    assert new == 6
    # One stamp for the prompt, one per new token: prefill ends at times[1], decode is the rest.
    assert len(stamps.times) == 1 + new
    assert stamps.times == sorted(stamps.times)


def test_the_rates_table_has_both_phases_and_the_ratio():
    table = demo.rates_table({"prefill": 100.0, "decode": 10.0},
                             {"prefill": 250.0, "decode": 45.0})
    lines = table.splitlines()
    assert lines[0].split("|")[0].strip() == "phase"
    assert [ln.split("|")[0].strip() for ln in lines[1:]] == ["prefill", "decode"]
    assert lines[1].split("|")[3].strip() == "2.50x"
    assert lines[2].split("|")[3].strip() == "4.50x"
    assert lines[2].split("|")[1].strip() == "10.0"

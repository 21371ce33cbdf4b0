"""The gated delta rule and its causal convolution, per call: flashrt/recurrent's seats against
the torch functions transformers falls back to on a CPU (its reference chunked and recurrent
rules, its causal_conv1d_fn and causal_conv1d_update), decode (one token, from a state) and
prompt (chunked) forms apart.

Widths are the Qwen3.5 configuration class's defaults (16 key heads and 32 value heads of 128,
a 4-tap convolution over the 8192 q/k/v channels); the seats come from a plan over a two-layer
host of those widths, and the torch functions are that host's own. Arms alternate call by call
in one process; each figure is the median of `--rounds` paired rounds, and the ratio is the
median of the per-round ratios. The decode rule's floor is its state's bytes (read and written
once, fp32) over the measured read bandwidth.

    .venv/bin/python bench/recurrence.py --json bench/results/<tier>/recurrence.json
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

import flashrt_structures as S
from flashrt_structures import _core, ops

from _common import machine, write_result

HK, HV, DK, DV, TAPS = 16, 32, 128, 128, 4
CHANNELS = 2 * HK * DK + HV * DV


def host() -> Qwen3_5ForCausalLM:
    cfg = Qwen3_5TextConfig(vocab_size=256, hidden_size=256, intermediate_size=256,
                            num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                            num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                            linear_num_key_heads=HK, linear_num_value_heads=HV,
                            linear_key_head_dim=DK, linear_value_head_dim=DV,
                            linear_conv_kernel_dim=TAPS)
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM(cfg).eval()


def timed(fn: Callable[[], object], iters: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def paired(host_fn: Callable[[], object], seat_fn: Callable[[], object], rounds: int,
           iters: int) -> dict:
    hosts, seats = [], []
    for r in range(rounds):
        order = [(hosts, host_fn), (seats, seat_fn)]
        for out, fn in order if r % 2 == 0 else order[::-1]:
            out.append(timed(fn, iters))
    ratios = [h / s for h, s in zip(hosts, seats)]
    return {"host_s": statistics.median(hosts), "seat_s": statistics.median(seats),
            "speedup": statistics.median(ratios), "ratios": ratios}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--prompt", type=int, default=512)
    args = parser.parse_args()

    model = host()
    ids = torch.randint(0, 256, (1, 8))
    plan = S.auto_swaps(model, lambda: model(ids), structures=["gated_delta_core", "causal_conv"])
    rule = next(s for s in plan.swaps.values() if s.seat.form.op == _core.OpKind.gated_delta)
    conv = next(s for s in plan.swaps.values() if s.seat.form.op == _core.OpKind.causal_conv1d)
    ns = sys.modules[type(rule.host).__module__].__dict__
    chunk = inspect.unwrap(ns["torch_chunk_gated_delta_rule"])
    recurrent = inspect.unwrap(ns["torch_recurrent_gated_delta_rule"])
    conv_fn = inspect.unwrap(ns["causal_conv1d_fn"])
    conv_update = inspect.unwrap(ns["causal_conv1d_update"])
    weight = conv.host.weight.detach().squeeze(1)
    bandwidth = ops.read_bandwidth_gbps(1 << 28, repeats=3)
    g = torch.Generator().manual_seed(1)

    rows = []
    for form, tokens in (("decode", 1), ("prompt", args.prompt)):
        # As the module hands them: q, k, v slices of one [1, tokens, channels] row.
        qkv = torch.randn(1, tokens, CHANNELS, generator=g)
        q, k, v = torch.split(qkv, [HK * DK, HK * DK, HV * DV], dim=-1)
        q, k, v = q.view(1, tokens, HK, DK), k.view(1, tokens, HK, DK), v.view(1, tokens, HV, DV)
        decay = -torch.rand(1, tokens, HV, generator=g)
        beta = torch.rand(1, tokens, HV, generator=g)
        state = torch.randn(1, HV, DK, DV, generator=g) * 0.1
        out, final = torch.empty(1, tokens, HV, DV), torch.empty(1, HV, DK, DV)
        ref = recurrent if form == "decode" else chunk
        init = state if form == "decode" else None

        def host_rule() -> object:
            return ref(q, k, v, g=decay, beta=beta, initial_state=init, output_final_state=True,
                       use_qk_l2norm_in_kernel=True)

        def seat_rule() -> object:
            verdict = rule.seat.call(q, k, v, decay, beta, init, out, final, True, DK ** -0.5,
                                     False)
            assert verdict == _core.Verdict.ran.value, rule.seat.ledger.last_reason
            return out

        iters = 50 if form == "decode" else 2
        r = paired(host_rule, seat_rule, args.rounds, iters)
        want, _ = host_rule()
        seat_rule()
        r["cosine"] = float(torch.nn.functional.cosine_similarity(
            out.flatten().double(), want.flatten().double(), dim=0))
        state_bytes = 2 * HV * DK * DV * 4
        r.update(op="gated_delta", form=form, tokens=tokens,
                 host_function=ref.__name__,
                 floor_s=state_bytes / (bandwidth * 1e9) if form == "decode" else None,
                 gflops=tokens * HV * DK * DV * 8 / r["seat_s"] / 1e9)
        rows.append(r)

        x = qkv.transpose(1, 2)  # [1, channels, tokens] with channels contiguous, as the module's
        y = torch.empty(1, tokens, CHANNELS).transpose(1, 2)
        conv_state = torch.randn(1, CHANNELS, TAPS, generator=g)
        if form == "decode":
            host_state = conv_state.clone()

            def host_conv() -> object:
                return conv_update(x, host_state, weight, None, "silu")

            def seat_conv() -> object:
                return conv.seat.call(x, weight, None, conv_state, y, _core.Activation.silu,
                                      False)
        else:
            def host_conv() -> object:
                return conv_fn(x, weight, None, activation="silu")

            def seat_conv() -> object:
                return conv.seat.call(x, weight, None, None, y, _core.Activation.silu, False)
        r = paired(host_conv, seat_conv, args.rounds, 200 if form == "decode" else 10)
        r.update(op="causal_conv1d", form=form, tokens=tokens,
                 host_function=(conv_update if form == "decode" else conv_fn).__name__)
        rows.append(r)

    print(f"machine: {machine()['cpu']}, tier {machine()['tier']}, read bandwidth "
          f"{bandwidth:.1f} GB/s, kernels on {S.PARALLEL_BACKEND}")
    print(f"Qwen3.5 widths: q/k {HK}x{DK}, v {HV}x{DV}, conv {CHANNELS} channels x {TAPS} taps, "
          f"prompt {args.prompt}")
    print(f"{'op':<16}{'form':<8}{'host fn':<34}{'host ms':>10}{'seat ms':>10}{'speedup':>9}"
          f"{'floor ms':>10}")
    for r in rows:
        floor = f"{r['floor_s'] * 1e3:>10.3f}" if r.get("floor_s") else f"{'':>10}"
        print(f"{r['op']:<16}{r['form']:<8}{r['host_function']:<34}{r['host_s'] * 1e3:>10.3f}"
              f"{r['seat_s'] * 1e3:>10.3f}{r['speedup']:>8.1f}x{floor}")
    write_result(args.json, {"machine": machine(), "read_bandwidth_gbps": bandwidth,
                             "widths": {"k_heads": HK, "v_heads": HV, "k_dim": DK, "v_dim": DV,
                                        "channels": CHANNELS, "taps": TAPS},
                             "rounds": args.rounds, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One DiT denoising step on CPU: the host in fp32 against the w8a8 GEMM seats (w8a8_dynamic)
and the int8 paths a CPU user would reach for, torch.ao's quantize_dynamic (fbgemm) and torchao's
int8 dynamic-activation config.

Hosts are diffusers' own classes from config with random weights, fp32, batch 1:
  pixart  PixArt-Sigma-shaped: hidden 1152 (16 heads x 72), 28 blocks (--pixart-layers),
          1024 latent tokens (a 64x64 latent, patch 2), 300 caption tokens of 4096 channels;
  flux    Flux-shaped widths (hidden 3072, 24 heads x 128, MLP 12288), --flux-double double and
          --flux-single single blocks so fp32 fits in 24 GiB beside the arms' copies; 1024
          latent tokens, 256 text tokens.
  pixart4 the PixArt-Sigma widths and tokens with 4 blocks: the host where torchao runs too
          (--torchao-hosts; on the AVX2 machines its step was over 10x the host's, so it is timed
          once where it runs and not run on the full-size hosts, which says so in the JSON).
Arms alternate round by round in one process, the order rotated each round; per arm the median
step time, the median of its per-round ratios to the host, and the output cosine against the
host's step. An arm over 5x slower than the host is timed on its one (first) run.

The bf16 arms: the host cast to bf16 (torch's own bf16 path, oneDNN and its flash attention),
the w8a8_dynamic seats on that bf16 twin with its attention modules seated too
(attention_sequence: the processors' whole-sequence attention on flashrt/gemm), and the same
seats with attention left to torch; `speedup_vs_attention_at_host` pairs the last two by round.
--caption-tokens N gives the PixArt hosts' 300 caption tokens a padding mask keeping N of them,
as a pipeline does (the cross-attention's bias then goes to the seat as a range of keys).

--qkv measures qkv_pack against the per-projection seats it replaces (the key "qkv_pack" of the
JSON, the file's other keys kept): per host, paired alternated arms of one step (host fp32,
w8a8 with each q/k/v its own seat, w8a8 with sibling projections packed), the per-round ratio of
the two w8a8 arms and its spread (the noise floor of the figure), and the q/k/v projections of
one attention alone at the host's shape (three seats against one pack), where the gain is made.

--band measures the row count from which the GEMM seat beats the host's fp32 linear on the DiT
projection shapes (the w8a8 form's band min in catalog/schemes.yaml).

--ffn measures the fused GEMM feed-forward seat (flashrt/gemm's ffn: one seat per FeedForward,
GELU and the hidden rows' requantization inside the op) against the per-projection arm (the two
projections seated on their own, the host's GELU between them): on a diffusers FeedForward of
the PixArt-Sigma and Flux widths over 1024 tokens, and in the whole step beside the host and the
peers. It writes the key "ffn_fused" into the JSON, keeping the file's other keys.

    .venv/bin/python bench/dit.py --json bench/results/dit.json
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import flashrt_structures as S
from flashrt_structures import decisions

from _common import machine, write_result

Step = Callable[[], Any]
SLOW = 5.0  # an arm this many times slower than the host is timed once (torchao on CPU)
TORCHAO_SKIPPED = ("not run on this host: torchao runs on the pixart4 host only (--torchao-hosts): "
                   "on the AVX2 machines its step was over 10x the host's, too long for this "
                   "benchmark's time budget")


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(),
                                                 dim=0).item()


def pixart(layers: int, caption: int = 0) -> tuple[nn.Module, Callable[[nn.Module], Step]]:
    """`caption` > 0: the 300 caption tokens carry a padding mask keeping the first `caption`
    (a pipeline passes one: PixArt's captions are padded to 300)."""
    from diffusers import PixArtTransformer2DModel
    torch.manual_seed(0)
    m = PixArtTransformer2DModel(num_attention_heads=16, attention_head_dim=72, in_channels=4,
                                 out_channels=8, num_layers=layers, cross_attention_dim=1152,
                                 sample_size=64, patch_size=2, caption_channels=4096,
                                 norm_type="ada_norm_single",
                                 use_additional_conditions=False).eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4, 64, 64, generator=g)
    e = torch.randn(1, 300, 4096, generator=g)
    t = torch.tensor([500])
    mask = None
    if caption > 0:
        mask = torch.zeros(1, 300)
        mask[:, :caption] = 1
    return m, lambda mod: lambda: mod(x, encoder_hidden_states=e, timestep=t,
                                      encoder_attention_mask=mask).sample


def flux(double: int, single: int) -> tuple[nn.Module, Callable[[nn.Module], Step]]:
    from diffusers import FluxTransformer2DModel
    torch.manual_seed(0)
    m = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=double,
                               num_single_layers=single, attention_head_dim=128,
                               num_attention_heads=24, joint_attention_dim=4096,
                               pooled_projection_dim=768, guidance_embeds=False,
                               axes_dims_rope=(16, 56, 56)).eval()
    g, side, text = torch.Generator().manual_seed(1), 32, 256
    n = side * side
    x = torch.randn(1, n, 64, generator=g)
    e = torch.randn(1, text, 4096, generator=g)
    p = torch.randn(1, 768, generator=g)
    img_ids = torch.zeros(n, 3)
    img_ids[:, 1], img_ids[:, 2] = torch.arange(n) // side, torch.arange(n) % side
    txt_ids = torch.zeros(text, 3)
    t = torch.tensor([0.5])
    return m, lambda mod: lambda: mod(x, encoder_hidden_states=e, pooled_projections=p,
                                      timestep=t, img_ids=img_ids, txt_ids=txt_ids).sample


def fbgemm_arm(model: nn.Module) -> nn.Module:
    return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear},
                                                  dtype=torch.qint8)


def torchao_arm(model: nn.Module) -> tuple[nn.Module | None, str]:
    try:
        import torchao
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        return None, f"torchao unavailable: {type(e).__name__}: {e}"
    twin = copy.deepcopy(model)
    quantize_(twin, Int8DynamicActivationInt8WeightConfig())
    return twin, f"torchao {torchao.__version__} Int8DynamicActivationInt8WeightConfig"


def bf16_twin(model: nn.Module) -> nn.Module:
    """The host cast to bf16 (torch's own bf16 path: oneDNN, on AMX where the CPU has it), its
    floating inputs cast on the way in, so the same step closure drives it."""
    twin = copy.deepcopy(model).to(torch.bfloat16)

    def cast(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        def one(v: Any) -> Any:
            return v.bfloat16() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}

    twin.register_forward_pre_hook(cast, with_kwargs=True)
    return twin


def timed(fn: Step) -> tuple[float, torch.Tensor]:
    t0 = time.perf_counter()
    with torch.no_grad():
        out = fn()
    return time.perf_counter() - t0, out


def bench_host(name: str, model: nn.Module, step_for: Callable[[nn.Module], Step], rounds: int,
               peers: bool, torchao: bool, per_projection_arm: bool = False) -> dict:
    step = step_for(model)
    with torch.no_grad():
        want = step()
    plan = S.auto_swaps(model, step, scheme="w8a8_dynamic")
    seated = len(plan.swaps)
    kept = len(plan.notes["scheme"]["keep_host"])
    refused = len(plan.notes["refused"])
    arms: dict[str, dict[str, Any]] = {"host_fp32": {}, "flashrt_w8a8": {}}
    plans = {"flashrt_w8a8": plan}
    if per_projection_arm:  # the feed-forwards' projections seated one by one, GELU at the host
        plans["flashrt_w8a8_ffn_as_projections"] = S.auto_swaps(
            model, step, scheme="w8a8_dynamic",
            structures=[s for s in S.list_structures() if s != "encoder_ffn"])
        arms["flashrt_w8a8_ffn_as_projections"] = {
            "what": "w8a8_dynamic without encoder_ffn: each FeedForward's two projections are "
                    "gemm linear seats, the GELU runs at the host between them"}
        arms["flashrt_w8a8"]["ffn_seats"] = sum(
            1 for sp in plan.seams if sp.seam.structure == "encoder_ffn")
    twins: dict[str, nn.Module] = {"host_bf16": bf16_twin(model)}
    arms["host_bf16"] = {"what": "the host cast to bf16 (inputs cast on entry): torch's bf16 "
                                 "path, oneDNN (AMX where the CPU has it)"}
    # w8a8_dynamic's seats on that bf16 twin: the GEMMs on flashrt/gemm (AMX tiles where the
    # CPU grants them) and the attention modules' whole-sequence attention (attention_sequence,
    # bf16 only); the rest on torch's bf16 path. The paired arm without attention_sequence says
    # what the attention seats add.
    bf16_host = twins["host_bf16"]
    plans["flashrt_w8a8_on_bf16_host"] = S.auto_swaps(bf16_host, step_for(bf16_host),
                                                      scheme="w8a8_dynamic")
    arms["flashrt_w8a8_on_bf16_host"] = {
        "what": "w8a8_dynamic seats on the bf16 twin, attention_sequence included",
        "attention_seats": sum(1 for sp in plans["flashrt_w8a8_on_bf16_host"].seams
                               if sp.seam.structure == "attention_sequence")}
    plans["flashrt_w8a8_on_bf16_host_attention_at_host"] = S.auto_swaps(
        bf16_host, step_for(bf16_host), scheme="w8a8_dynamic",
        structures=[s for s in S.list_structures() if s != "attention_sequence"])
    arms["flashrt_w8a8_on_bf16_host_attention_at_host"] = {
        "what": "the same seats without attention_sequence: attention on torch's bf16 sdpa"}
    if peers:
        twins["fbgemm_quantize_dynamic"] = fbgemm_arm(model)
        arms["fbgemm_quantize_dynamic"] = {"what": "torch.ao.quantization.quantize_dynamic "
                                           "(qint8, nn.Linear), fbgemm"}
        twin, what = torchao_arm(model) if torchao else (None, TORCHAO_SKIPPED)
        if twin is None:
            arms["torchao_int8_dynamic"] = {"unavailable": what}
        else:
            twins["torchao_int8_dynamic"] = twin
            arms["torchao_int8_dynamic"] = {"what": what}
    handle = None

    def run(arm: str) -> tuple[float, torch.Tensor]:
        nonlocal handle
        if arm in plans:
            h = plans[arm].attach(bf16_host if "_on_bf16_host" in arm else model)
            if arm == "flashrt_w8a8":
                handle = h
            try:
                return timed(step_for(bf16_host) if "_on_bf16_host" in arm else step)
            finally:
                h.detach()
        if arm == "host_fp32":
            return timed(step)
        return timed(step_for(twins[arm]))  # the same inputs through the peer's twin

    order = [a for a in arms if "unavailable" not in arms[a]]
    times: dict[str, list[float]] = {a: [] for a in order}
    outs: dict[str, torch.Tensor] = {}
    warm: dict[str, float] = {}
    for a in order:  # warm-up, one each; an arm far slower than the host is timed on that run
        warm[a], outs[a] = run(a)
        if a != "host_fp32" and warm[a] > SLOW * warm["host_fp32"]:
            times[a].append(warm[a])
            arms[a]["timed_once"] = f"over {SLOW}x the host's step: its one (first) run is its time"
    for r in range(rounds):
        rot = order[r % len(order):] + order[:r % len(order)]
        for a in rot:
            if "timed_once" in arms[a]:
                continue
            t, out = run(a)
            times[a].append(t)
            outs[a] = out
        print(f"  {name} round {r + 1}/{rounds}: " +
              ", ".join(f"{a} {times[a][-1]:.2f}s" for a in order if times[a]), flush=True)
    host, host_bf16 = times["host_fp32"], times["host_bf16"]
    for a in order:
        ratios = [h / t for h, t in zip(host, times[a])]  # paired by round
        arms[a].update({"step_s": statistics.median(times[a]), "times_s": times[a],
                        "speedup_vs_host": statistics.median(ratios),
                        "speedup_vs_host_bf16": statistics.median(
                            h / t for h, t in zip(host_bf16, times[a])),
                        "cosine_vs_host": cosine(outs[a], want)})
    # What the attention seats add: the two bf16-twin arms, paired round by round.
    with_attention, without = (times["flashrt_w8a8_on_bf16_host"],
                               times["flashrt_w8a8_on_bf16_host_attention_at_host"])
    arms["flashrt_w8a8_on_bf16_host"]["speedup_vs_attention_at_host"] = statistics.median(
        w / t for t, w in zip(with_attention, without))
    summary = handle.summary() if handle is not None else {}
    return {"host": name, "params": sum(p.numel() for p in model.parameters()),
            "plan": {"seated": seated, "kept_at_host": kept, "refused": refused},
            "ledger_last_attach": summary, "arms": arms}


def _spread(xs: list[float]) -> float:
    return (max(xs) - min(xs)) / statistics.median(xs) if xs else 0.0


def qkv_projections(model: nn.Module, per_proj: Any, packed: Any, reps: int) -> dict:
    """One attention's q/k/v at the host's shape: three per-projection seats against the pack."""
    sp = next(sp for sp in packed.seams if len(sp.replaces) == 3)
    rows = max(sp.seam.rows_seen)
    k = model.get_submodule(sp.replaces[0]).in_features
    x = torch.randn(1, rows, k, generator=torch.Generator().manual_seed(7))
    three = [per_proj.swaps[p] for p in sp.replaces]
    pack = [packed.swaps[p] for p in sp.replaces]
    times: dict[str, list[float]] = {"per_projection": [], "packed": []}
    handles = {"per_projection": per_proj, "packed": packed}
    with torch.no_grad():
        for r in range(2 * reps + 2):
            arm = "per_projection" if r % 2 == 0 else "packed"
            handle = handles[arm].attach(model)
            try:
                seats = three if arm == "per_projection" else pack
                t0 = time.perf_counter()
                for _ in range(5):
                    for seat in seats:
                        seat(x)
                if r >= 2:  # the first pair warms up
                    times[arm].append((time.perf_counter() - t0) / 5)
            finally:
                handle.detach()
    ratios = [a / b for a, b in zip(times["per_projection"], times["packed"])]
    return {"pack": list(sp.replaces), "rows": rows, "k": k,
            "n": [model.get_submodule(p).out_features for p in sp.replaces],
            "per_projection_ms": 1e3 * statistics.median(times["per_projection"]),
            "packed_ms": 1e3 * statistics.median(times["packed"]),
            "speedup": statistics.median(ratios), "ratios": ratios, "spread": _spread(ratios)}


def bench_qkv(name: str, model: nn.Module, step_for: Callable[[nn.Module], Step],
              rounds: int) -> dict:
    """Step time with qkv_pack against the same scheme with every projection its own seat."""
    step = step_for(model)
    with torch.no_grad():
        want = step()
    every = [s for s in S.list_structures() if s != "qkv_pack"]
    plans = {"flashrt_w8a8_per_projection": S.auto_swaps(model, step, scheme="w8a8_dynamic",
                                                         structures=every),
             "flashrt_w8a8_qkv_pack": S.auto_swaps(model, step, scheme="w8a8_dynamic")}
    npacks = sum(1 for sp in plans["flashrt_w8a8_qkv_pack"].seams if len(sp.replaces) > 1)
    arms = ["host_fp32", *plans]

    def run(arm: str) -> tuple[float, torch.Tensor, dict]:
        if arm == "host_fp32":
            return (*timed(step), {})
        handle = plans[arm].attach(model)
        try:
            t, out = timed(step)
            return t, out, handle.summary()
        finally:
            handle.detach()

    times: dict[str, list[float]] = {a: [] for a in arms}
    outs: dict[str, torch.Tensor] = {}
    ledgers: dict[str, dict] = {}
    for a in arms:
        run(a)  # warm-up
    for r in range(rounds):
        for a in arms[r % len(arms):] + arms[:r % len(arms)]:
            t, outs[a], ledgers[a] = run(a)
            times[a].append(t)
        print(f"  {name} qkv round {r + 1}/{rounds}: " +
              ", ".join(f"{a} {times[a][-1]:.2f}s" for a in arms), flush=True)
    per, pk = times["flashrt_w8a8_per_projection"], times["flashrt_w8a8_qkv_pack"]
    ratios = [a / b for a, b in zip(per, pk)]
    out = {"host": name, "packs": npacks, "rounds": rounds,
           "arms": {a: {"step_s": statistics.median(times[a]), "times_s": times[a],
                        "speedup_vs_host": statistics.median(
                            h / t for h, t in zip(times["host_fp32"], times[a])),
                        "cosine_vs_host": cosine(outs[a], want), "ledger": ledgers[a]}
                    for a in arms},
           "qkv_pack_vs_per_projection": statistics.median(ratios), "ratios": ratios,
           "spread": _spread(ratios)}
    out["qkv_projections"] = qkv_projections(model, plans["flashrt_w8a8_per_projection"],
                                             plans["flashrt_w8a8_qkv_pack"], rounds)
    return out


def measure_band(rounds: int) -> dict:
    """The GEMM seat's kernel against the host's fp32 linear, by rows, on the DiT projection
    shapes, and the band min by the rule `python -m flashrt_structures tune` applies
    (flashrt_structures.decisions), rows 1 and 16 shown beside it."""
    m = decisions.measure_rows_min([(1152, 1152), (1152, 4608), (4608, 1152), (3072, 3072)],
                                   [1, 16, 24, 32, 48, 64, 128, 256], rounds)
    for shape, row in m["speedup_by_rows"].items():
        print(f"  band {shape.replace('x', '->')}: "
              + ", ".join(f"{r}:{v:.2f}" for r, v in row.items()), flush=True)
    return {"speedup_by_rows": m["speedup_by_rows"], "geomean_by_rows": m["geomean_by_rows"],
            "band_min": m["rows_min"], "rule": m["rule"]}


def ffn_module(dim: int, tokens: int) -> tuple[nn.Module, torch.Tensor]:
    """A diffusers FeedForward (GELU-tanh, biases, 4x) of width `dim` under a parent module, so
    the seat can stand in the parent's place; its input: `tokens` latent rows."""
    from diffusers.models.attention import FeedForward

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ff = FeedForward(dim, dim_out=dim, activation_fn="gelu-approximate")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.ff(x)

    torch.manual_seed(0)
    return Block().eval(), torch.randn(1, tokens, dim, generator=torch.Generator().manual_seed(1))


def bench_ffn(dim: int, tokens: int, rounds: int) -> dict:
    """One FeedForward call: host fp32, the fused seat, the per-projection seats; paired rounds,
    alternated, medians."""
    block, x = ffn_module(dim, tokens)
    with torch.no_grad():
        want = block(x)
    fused = S.auto_swaps(block, lambda: block(x), scheme="w8a8_dynamic")
    per_proj = S.auto_swaps(block, lambda: block(x), scheme="w8a8_dynamic",
                            structures=["linear_proj"])
    assert [sp.impl for sp in fused.seams] == ["gemm_ffn_w8a8"], S.explain(fused)
    assert len(per_proj.swaps) == 2, S.explain(per_proj)
    plans = {"fused_ffn_seat": fused, "per_projection_seats": per_proj}
    reps = 3

    def run(arm: str) -> tuple[float, torch.Tensor]:
        h = plans[arm].attach(block) if arm in plans else None
        try:
            with torch.no_grad():
                out = block(x)  # warm: the first call after attach sizes the workspace
                t0 = time.perf_counter()
                for _ in range(reps):
                    out = block(x)
                return (time.perf_counter() - t0) / reps, out
        finally:
            if h is not None:
                h.detach()

    order = ["host_fp32", "fused_ffn_seat", "per_projection_seats"]
    times: dict[str, list[float]] = {a: [] for a in order}
    outs: dict[str, torch.Tensor] = {}
    for r in range(rounds):
        for a in order[r % 3:] + order[:r % 3]:
            t, outs[a] = run(a)
            times[a].append(t)
    arms: dict[str, Any] = {}
    for a in order:
        arms[a] = {"call_s": statistics.median(times[a]), "times_s": times[a],
                   "speedup_vs_host": statistics.median(
                       h / t for h, t in zip(times["host_fp32"], times[a])),
                   "cosine_vs_host": cosine(outs[a], want)}
    fused_vs_proj = statistics.median(
        p / f for p, f in zip(times["per_projection_seats"], times["fused_ffn_seat"]))
    weights = 2 * dim * 4 * dim
    macs = tokens * weights
    floor = {"int8_weight_bytes": weights,
             "fused_int8_gops": 2 * macs / arms["fused_ffn_seat"]["call_s"] / 1e9}
    print(f"  ffn {dim}->{4 * dim}->{dim} x{tokens}: host {arms['host_fp32']['call_s'] * 1e3:.1f} "
          f"ms, fused {arms['fused_ffn_seat']['call_s'] * 1e3:.1f} ms, per-projection "
          f"{arms['per_projection_seats']['call_s'] * 1e3:.1f} ms, fused/per-projection "
          f"{fused_vs_proj:.2f}x", flush=True)
    return {"shape": {"hidden": dim, "intermediate": 4 * dim, "tokens": tokens,
                      "activation": "gelu_tanh"},
            "arms": arms, "fused_speedup_vs_per_projection": fused_vs_proj, "floor": floor}


def run_ffn(a: argparse.Namespace) -> None:
    import json
    result = json.loads(a.json.read_text()) if a.json.exists() else {}
    out: dict[str, Any] = {"machine": machine(), "rounds": a.rounds, "feed_forward": {},
                           "steps": []}
    for name, dim in (("pixart_sigma", 1152), ("flux", 3072)):
        out["feed_forward"][name] = bench_ffn(dim, 1024, max(5, a.rounds))
        result["ffn_fused"] = out
        write_result(a.json, result)
    for name in filter(None, a.hosts.split(",")):
        if name.startswith("pixart"):
            model, step_for = pixart(int(name[6:]) if name[6:] else a.pixart_layers,
                                     a.caption_tokens)
        else:
            model, step_for = flux(a.flux_double, a.flux_single)
        print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params",
              flush=True)
        out["steps"].append(bench_host(name, model, step_for, a.rounds, not a.no_peers,
                                       name in a.torchao_hosts.split(","),
                                       per_projection_arm=True))
        result["ffn_fused"] = out
        write_result(a.json, result)
        del model, step_for
        gc.collect()
    print(f"\n{'ffn':14} {'arm':22} {'call ms':>8} {'x host':>7} {'cosine':>9}")
    for name, r in out["feed_forward"].items():
        for arm, v in r["arms"].items():
            print(f"{name:14} {arm:22} {v['call_s'] * 1e3:8.1f} {v['speedup_vs_host']:7.2f} "
                  f"{v['cosine_vs_host']:9.5f}")
        print(f"{name:14} fused / per-projection {r['fused_speedup_vs_per_projection']:.2f}x")
    print_steps(out["steps"])


def print_steps(hosts: list[dict]) -> None:
    print(f"\n{'host':8} {'arm':44} {'step s':>8} {'x host':>7} {'x bf16':>7} {'cosine':>9}")
    for h in hosts:
        for arm, r in h["arms"].items():
            if "unavailable" in r:
                print(f"{h['host']:8} {arm:44} unavailable: {r['unavailable']}")
                continue
            print(f"{h['host']:8} {arm:44} {r['step_s']:8.2f} {r['speedup_vs_host']:7.2f} "
                  f"{r.get('speedup_vs_host_bf16', float('nan')):7.2f} "
                  f"{r['cosine_vs_host']:9.5f}")
        gain = h["arms"].get("flashrt_w8a8_on_bf16_host", {}).get("speedup_vs_attention_at_host")
        if gain is not None:
            print(f"{h['host']:8} attention seats: {gain:.3f}x the same seats with torch's "
                  "attention (paired rounds)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=Path("bench/results/dit.json"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hosts", default="pixart,flux,pixart4")
    ap.add_argument("--torchao-hosts", default="pixart4",
                    help="hosts on which the torchao peer runs (slow on CPU)")
    ap.add_argument("--pixart-layers", type=int, default=28)
    ap.add_argument("--caption-tokens", type=int, default=0,
                    help="PixArt hosts: a padding mask keeping this many of the 300 caption tokens")
    ap.add_argument("--flux-double", type=int, default=1)
    ap.add_argument("--flux-single", type=int, default=2)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--band", action="store_true", help="measure the w8a8 form's band min too")
    ap.add_argument("--qkv", action="store_true",
                    help="qkv_pack against per-projection seats (the JSON's qkv_pack key)")
    ap.add_argument("--ffn", action="store_true",
                    help="the fused FFN seat against the per-projection arm (key ffn_fused)")
    a = ap.parse_args()
    if a.ffn:
        run_ffn(a)
        return
    if a.qkv:
        kept = json.loads(a.json.read_text()) if a.json.exists() else {}
        entry: dict[str, Any] = {"machine": machine(), "hosts": []}
        for name in filter(None, a.hosts.split(",")):
            if name.startswith("pixart"):
                model, step_for = pixart(int(name[6:]) if name[6:] else a.pixart_layers)
            else:
                model, step_for = flux(a.flux_double, a.flux_single)
            entry["hosts"].append(bench_qkv(name, model, step_for, a.rounds))
            kept["qkv_pack"] = entry
            write_result(a.json, kept)
            del model, step_for
            gc.collect()
        print(f"\n{'host':8} {'arm':30} {'step s':>8} {'x host':>7} {'cosine':>9}")
        for h in entry["hosts"]:
            for arm, r in h["arms"].items():
                print(f"{h['host']:8} {arm:30} {r['step_s']:8.2f} {r['speedup_vs_host']:7.2f} "
                      f"{r['cosine_vs_host']:9.5f}")
            q = h["qkv_projections"]
            print(f"{h['host']:8} packed / per-projection step "
                  f"{h['qkv_pack_vs_per_projection']:.3f}x "
                  f"(spread {h['spread']:.3f}); one attention's q/k/v "
                  f"{q['per_projection_ms']:.2f} -> {q['packed_ms']:.2f} ms ({q['speedup']:.3f}x)")
        return
    result: dict[str, Any] = {"machine": machine(), "rounds": a.rounds, "hosts": [],
                              "caption_tokens_kept": a.caption_tokens or None}
    if a.band:
        result["band"] = measure_band(max(3, a.rounds))
    for name in filter(None, a.hosts.split(",")):
        if name.startswith("pixart"):  # pixart4: the same widths and tokens, 4 blocks
            model, step_for = pixart(int(name[6:]) if name[6:] else a.pixart_layers)
        else:
            model, step_for = flux(a.flux_double, a.flux_single)
        print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params",
              flush=True)
        result["hosts"].append(bench_host(name, model, step_for, a.rounds, not a.no_peers,
                                          name in a.torchao_hosts.split(",")))
        write_result(a.json, result)  # after each host: a long run keeps what it measured
        del model, step_for
        gc.collect()
    print_steps(result["hosts"])
    write_result(a.json, result)


if __name__ == "__main__":
    main()

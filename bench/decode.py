"""decode_loop on a Qwen3-0.6B-shaped host: prefill and steady decode, against the host.

Qwen3-0.6B's real config sizes (see bench/door.py), random weights, fp32, batch 1, a 128-token
prompt and 128 new tokens, greedy. Arms, alternating round by round in one process:
  host            the host's own forward with its KV cache (prefill one 128-token forward,
                  then one forward per token): what greedy `generate` does, timed per phase
  attached_w8     the same with w8a16_decode seats attached (swap.attach)
  loop_none       decode_loop over the host's own fp32 weights
  loop_w8/_w4     decode_loop over w8a16_decode / w4a16_decode seats (w8: int8 with a scale per
                  64 inputs; w4: int4 g32 with a min)
  loop_w8_channel decode_loop over w8a16_channel_decode seats (int8, a scale per channel)
  loop_w4_sym     decode_loop over w4a16_sym_decode seats (int4 g32 symmetric)
  loop_w8a8       decode_loop over w8a8_decode seats (int8 activation rows, integer dot products)
  loop_w4a8(_asym) decode_loop over w4a8_decode / w4a8_asym_decode seats (int4 g32 nibbles
                  against int8 activation blocks; the head int8)
The loop prefills in blocks of up to 16 rows in the core. The floor is the bytes each decode step
must read (weights as each arm holds them, and the KV cache at its position) over the read
bandwidth: the loops and llama.cpp decode in segments of 16 steps, each held against the
bandwidth probed just before and just after it (Note [Bracketed bandwidth] in _common.py); the
figure is the median over segments and rounds.

Peers (torchao int8 weight-only; llama.cpp Q8_0/Q4_0 through llama-cpp-python) are optional:
they are measured when importable and reported as not installed otherwise.

    .venv/bin/python bench/decode.py                  # writes bench/results/<tier>/decode.json
    FRT_CPU_CAP=avx2 .venv/bin/python bench/decode.py # the AVX2 tier on an AVX-512 machine
    .venv/bin/python bench/decode.py --model smollm2  # bench/results/<tier>/decode_smollm2.json
    .venv/bin/python bench/decode.py --model qwen3-kquant  # decode_q4_k_m.json: llama.cpp's
                                                      # Q4_K_M of the same weights, adopted
    .venv/bin/python bench/decode.py --family all --layers 4  # decode_families.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

import flashrt_structures as S

from _common import (
    bracket,
    llama_logits,
    machine,
    probe,
    result_path,
    summarize,
    thp_fallbacks,
    write_result,
)

PROMPT, NEW = 128, 128


def host_arm(model, prompt, new):
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(prompt, use_cache=True)
        prefill = time.perf_counter() - t0
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        tokens = [int(tok)]
        t0 = time.perf_counter()
        for _ in range(new - 1):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            tokens.append(int(tok))
        decode = time.perf_counter() - t0
    return prefill, decode, tokens, []


SEGMENT = 16  # decode steps between two bandwidth probes (Note [Bracketed bandwidth])


def segmented(first: int, pos0: int, new: int, step: Callable[[int, int], int],
              step_bytes: Callable[[int], int]):
    """Greedy decode of `new` tokens from `first` (fed at position pos0) in segments of SEGMENT
    steps, each between two read-bandwidth probes. Returns (decode seconds, tokens, brackets):
    the seconds count the steps only; a bracket is a segment's bytes per second (step_bytes(p):
    what the step that attends over p positions reads) against its probes."""
    tokens, pos, secs, brackets = [first], pos0, 0.0, []
    while len(tokens) < new:
        count = min(SEGMENT, new - len(tokens))
        nbytes = sum(step_bytes(pos + i + 1) for i in range(count))
        state = {"pos": pos}

        def run(count=count, state=state) -> float:
            t0 = time.perf_counter()
            for _ in range(count):
                tokens.append(step(tokens[-1], state["pos"]))
                state["pos"] += 1
            return time.perf_counter() - t0
        b = bracket(lambda: run(), nbytes)
        secs += nbytes / (b.gbps * 1e9)
        brackets.append(b)
        pos = state["pos"]
    return secs, tokens, brackets


def loop_arm(loop, prompt, new, step_bytes):
    """decode_loop: the core prefills the prompt in blocks of 16 rows, then one step per token."""
    ids = prompt[0].tolist()
    t0 = time.perf_counter()
    first = loop.program.prefill(ids, 0)
    prefill = time.perf_counter() - t0
    secs, tokens, brackets = segmented(first, len(ids), new, loop.program.step, step_bytes)
    return prefill, secs, tokens, brackets


def llama_arm(llm, prompt, new, step_bytes):
    """llama.cpp through llama-cpp-python: prefill the prompt in one batch, then one token per
    eval, greedy (argmax of the last logits)."""
    def last_argmax() -> int:
        return int(llama_logits(llm).argmax())

    def step(tok: int, pos: int) -> int:
        llm.eval([tok])
        return last_argmax()

    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt[0].tolist())
    prefill = time.perf_counter() - t0
    secs, tokens, brackets = segmented(last_argmax(), prompt.shape[1], new, step, step_bytes)
    return prefill, secs, tokens, brackets


def llama_isa(llama_cpp) -> str:
    """What llama.cpp was built for (its system info: AVX2 = 1 | AVX512 = 1 ...), and where it
    was imported from: a run held at the AVX2 tier may take an AVX2-only build."""
    info = llama_cpp.llama_print_system_info().decode().strip()
    return f"built for: {info} ({Path(llama_cpp.__file__).parent})"


def vector_ceiling(threads: int) -> dict | None:
    """The machine's vector multiply-add ceilings (bench/probes/vector_ceiling.cpp: vpdpbusd and
    vfmadd231ps on operands in registers, GMAC/s over `threads`), the compute floor a batch step
    is held against; None where no compiler builds the probe, or where the amx variant serves:
    its tiles take the 16-row steps, so the vector units are not their ceiling."""
    chosen = {p["repo"]: p["chosen"] for p in S.impls.kernels_report()["packages"]}
    if shutil.which("g++") is None or any(c.endswith("-amx") for c in chosen.values()):
        return None
    src = Path(__file__).resolve().parent / "probes" / "vector_ceiling.cpp"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            exe = Path(tmp) / "probe"
            subprocess.run(["g++", "-O2", "-march=native", "-pthread", str(src), "-o", str(exe)],
                           check=True, capture_output=True)
            out = subprocess.run([str(exe), str(threads)], check=True, capture_output=True,
                                 text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return json.loads(out.stdout)


def bracketed_ceiling(before: dict | None, after: dict | None) -> dict | None:
    """A ceiling is the most the machine did: the larger of the runs before and after the arms
    (a neighbour's load on this shared guest only lowers one), both kept."""
    if before is None or after is None:
        return before or after
    return {"units": before["units"], "threads": before["threads"],
            **{u: max(before[u], after[u]) for u in ("int8_gmacs", "fp32_gmacs")},
            "before": before, "after": after}


def host_weight_bytes(model) -> int:
    return sum(m.weight.numel() * m.weight.element_size()
               for m in model.modules() if isinstance(m, torch.nn.Linear))


def kv_bytes(config, positions: int, element: int) -> int:
    """K and V of every layer over `positions` cached positions: what attention reads."""
    return (2 * config.num_hidden_layers * config.num_key_value_heads * positions * element *
            getattr(config, "head_dim", config.hidden_size // config.num_attention_heads))


SMOL_PROMPTS = ["What is the capital of France?", "Name three primary colors.",
                "Write a haiku about the sea.", "Explain what a CPU cache is.",
                "Give me a recipe for pancakes."]
SMOL_NEW = 64


def smollm2_main(args) -> int:
    """The real model: SmolLM2-135M-Instruct's Q4_1 GGUF. Arms, alternated per prompt: the
    host's greedy generate (fp32, dequantised by transformers), decode_loop over the file's own
    blocks (adopt_prequantized), and llama.cpp on the same file. Greedy agreement of decode_loop
    with llama.cpp over 64 tokens on 5 chat prompts (and over the first 32)."""
    from flashrt_structures import smollm2

    tok, model = smollm2.load()
    path = smollm2.checkpoint()
    prompts = [smollm2.chat_ids(tok, p) for p in SMOL_PROMPTS]
    max_len = max(p.shape[1] for p in prompts) + SMOL_NEW + 8
    report = S.adopt_prequantized(model, "gguf", path)
    loop = S.decode_loop(model, max_len)
    report.handle.detach()  # the loop holds the seats; the host arm runs the plain host
    cfg = model.config
    loop_step = lambda pos: loop.weight_bytes + kv_bytes(cfg, pos, 4)  # noqa: E731
    arms = {"host_generate": lambda p: host_arm(model, p, SMOL_NEW),
            "loop_adopted_q4_1": lambda p: loop_arm(loop, p, SMOL_NEW, loop_step)}
    peers = {}
    try:
        import llama_cpp

        llm = llama_cpp.Llama(model_path=str(path), n_ctx=max_len, n_batch=max_len,
                              n_threads=os.cpu_count(), logits_all=False, verbose=False)
        llama_step = lambda pos: path.stat().st_size + kv_bytes(cfg, pos, 2)  # noqa: E731
        arms["llama.cpp_q4_1"] = lambda p: llama_arm(llm, p, SMOL_NEW, llama_step)
        peers["llama_cpp"] = (f"llama-cpp-python {llama_cpp.__version__} on the same GGUF file; "
                              + llama_isa(llama_cpp))
    except ImportError as e:
        peers["llama_cpp"] = f"not measured: {e} (optional peer: pip install llama-cpp-python)"
    want = arm_filter(args.arms)
    # The host and the loop always run: the other arms are judged against them.
    arms = {n: fn for n, fn in arms.items()
            if want(n) or n in ("host_generate", "loop_adopted_q4_1")}
    samples: dict[str, list] = {n: [] for n in arms}
    for _ in range(args.rounds):
        for p in prompts:
            for name, fn in arms.items():
                samples[name].append(fn(p))
    rows = []
    print(f"machine: {machine()}")
    print(f"SmolLM2-135M-Instruct ({path.name}), {len(prompts)} chat prompts x {args.rounds} "
          f"rounds, {SMOL_NEW} new tokens greedy")
    for name in arms:
        pre_tok = sum(p.shape[1] for p in prompts) * args.rounds
        pre = sum(s[0] for s in samples[name])
        dec = statistics.median(s[1] / (SMOL_NEW - 1) for s in samples[name])
        row = {"arm": name, "prefill_tok_s": pre_tok / pre, "decode_tok_s": 1 / dec,
               "decode_step_seconds": dec}
        brackets = [b for s in samples[name] for b in s[3]]
        if brackets:  # the floor: each segment's bytes against its bracketing bandwidth
            row["floor"] = summarize(brackets)
            row["frac_of_floor"] = row["floor"]["frac_of_bandwidth"]
        rows.append(row)
    agreement = {}
    if "llama.cpp_q4_1" in samples:
        a64, a32 = [], []
        for mine, theirs in zip(samples["loop_adopted_q4_1"][:len(prompts)],
                                samples["llama.cpp_q4_1"][:len(prompts)]):
            a64.append(sum(x == y for x, y in zip(mine[2], theirs[2])) / SMOL_NEW)
            a32.append(sum(x == y for x, y in zip(mine[2][:32], theirs[2][:32])) / 32)
        agreement = {"loop_vs_llama_cpp_64": statistics.mean(a64),
                     "loop_vs_llama_cpp_first32": statistics.mean(a32), "per_prompt_64": a64}
    host_tokens = [s[2] for s in samples["host_generate"][:len(prompts)]]
    agreement["loop_vs_host_64"] = statistics.mean(
        sum(x == y for x, y in zip(m[2], h)) / SMOL_NEW
        for m, h in zip(samples["loop_adopted_q4_1"][:len(prompts)], host_tokens))
    print(f"{'arm':<20}{'prefill tok/s':>14}{'decode tok/s':>14}{'vs llama.cpp':>14}"
          f"{'of floor':>10}")
    ref = next((r["decode_tok_s"] for r in rows if r["arm"] == "llama.cpp_q4_1"), None)
    for r in rows:
        vs = f"{r['decode_tok_s'] / ref:>13.2f}x" if ref else f"{'-':>14}"
        fl = f"{r['frac_of_floor']:>10.0%}" if "frac_of_floor" in r else f"{'-':>10}"
        print(f"{r['arm']:<20}{r['prefill_tok_s']:>14.1f}{r['decode_tok_s']:>14.1f}{vs}{fl}")
    print(f"decode_loop weight bytes/token {loop.weight_bytes / 1e6:.1f} MB; agreement {agreement}")
    write_result(result_path(args.json, "decode_smollm2"), {
                             "bench": "decode_smollm2", "machine": machine(),
                             "model": path.name, "prompts": SMOL_PROMPTS, "new_tokens": SMOL_NEW,
                             "rounds": args.rounds, "rows": rows, "agreement": agreement,
                             "loop_weight_bytes": loop.weight_bytes, "peers": peers})
    return 0


def k_quant_file(model, folder: Path, ftype: str) -> Path:
    """The host's weights as llama.cpp's own quantizer writes them in mix `ftype` ("Q4_K_M"):
    bench/gguf_export.py writes them F16, llama_model_quantize does the rest."""
    import llama_cpp

    from gguf_export import export_qwen3

    source = export_qwen3(model, folder / "f16.gguf", "F16")
    out = folder / f"{ftype.lower()}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = os.cpu_count() or 1
    if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source} to {ftype}")
    source.unlink()
    return out


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each block type the file holds."""
    import gguf

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


def perplexities(model, loop, ids: list[int]) -> dict:
    """Perplexity of `ids` under the host (one forward) and under decode_loop (one step a
    token, each step's logits scored): the adopted blocks must give the host's figure."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    host_nll = [-float(logp[i, ids[i + 1]]) for i in range(len(ids) - 1)]
    loop_nll = []
    tok = loop.program.prefill(ids[:1], 0)
    for i in range(1, len(ids)):
        lp = torch.log_softmax(torch.from_numpy(loop.program.logits()).double(), -1)
        loop_nll.append(-float(lp[ids[i]]))
        if i < len(ids) - 1:
            tok = loop.program.step(ids[i], i)
    del tok
    host = float(torch.tensor(host_nll).mean().exp())
    mine = float(torch.tensor(loop_nll).mean().exp())
    return {"tokens": len(ids), "host": host, "decode_loop": mine,
            "equal_to_4_digits": f"{host:.4g}" == f"{mine:.4g}"}


def k_quant_main(args) -> int:
    """A Qwen3-0.6B-shaped host's weights quantized by llama.cpp's own quantizer to a K-quant
    mix (--kquant, default Q4_K_M); the host loaded from that file by transformers (its
    dequantised values), its blocks adopted (adopt_prequantized) and run by decode_loop, against
    llama.cpp on the same file: prefill and decode tok/s, alternated round by round, both decodes
    held against the file's bytes per token over the bracketing bandwidth (the floor); and the
    perplexity of a token sequence under the host and under the loop. The int8-activation
    adoption runs twice: over the loop's f32 KV cache and over a bf16 one (decode_loop(...,
    kv_cache="bf16"); each arm's floor counts the cache bytes it reads). --prompt / --new set the
    context (128 + 128 by default)."""
    import llama_cpp
    from transformers import AutoModelForCausalLM

    from door import qwen3_06b

    folder = Path(tempfile.mkdtemp(prefix="frt-kquant-"))
    try:
        path = k_quant_file(qwen3_06b(args.layers), folder, args.kquant)
        types = tensor_types(path)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=path.name,
                                                     dtype=torch.float32).eval()
        cfg = model.config
        prompt_len, new = args.prompt, args.new
        max_len = prompt_len + new
        # Two adoptions of the same blocks: against the host's activations, and the int4 block
        # types as integer dot products against int8 activation blocks (llama.cpp's own way),
        # the latter over an f32 and a bf16 KV cache.
        loops, reports, cache_bytes = {}, {}, {}
        for arm, activations, kv in (("loop_adopted", "host", "f32"),
                                     ("loop_adopted_a8", "int8", "f32"),
                                     ("loop_adopted_a8_kv_bf16", "int8", "bf16")):
            reports[arm] = S.adopt_prequantized(model, "gguf", path, activations=activations)
            loops[arm] = S.decode_loop(model, max_len, kv_cache=kv)
            cache_bytes[arm] = 4 if kv == "f32" else 2
            reports[arm].handle.detach()
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=max_len, n_batch=prompt_len,
                              n_threads=os.cpu_count(), logits_all=False, verbose=False)
        size = path.stat().st_size
        prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len),
                               generator=torch.Generator().manual_seed(1))
        # One numerator for every arm: the file's bytes per token (and the KV cache each reads).
        arms = {name: (lambda lp=lp, e=cache_bytes[name]: loop_arm(
                    lp, prompt, new, lambda pos: size + kv_bytes(cfg, pos, e)))
                for name, lp in loops.items()}
        arms["llama.cpp"] = lambda: llama_arm(llm, prompt, new,
                                              lambda pos: size + kv_bytes(cfg, pos, 2))
        samples: dict[str, list] = {n: [] for n in arms}
        for _ in range(args.rounds):
            for name, fn in arms.items():
                samples[name].append(fn())
        rows = []
        for name in arms:
            pre = statistics.median(s[0] for s in samples[name])
            dec = statistics.median(s[1] for s in samples[name]) / (new - 1)
            fl = summarize([b for s in samples[name] for b in s[3]])
            rows.append({"arm": name, "prefill_tok_s": prompt_len / pre, "decode_tok_s": 1 / dec,
                         "floor": fl, "frac_of_floor": fl["frac_of_bandwidth"]})
        theirs = rows[-1]
        per_loop = {}
        for r in rows[:-1]:
            name = r["arm"]
            report, lp = reports[name], loops[name]
            per_loop[name] = {
                "decode_vs_llama_cpp": r["decode_tok_s"] / theirs["decode_tok_s"],
                "prefill_vs_llama_cpp": r["prefill_tok_s"] / theirs["prefill_tok_s"],
                "greedy_tokens_equal": sum(a == b for a, b in zip(
                    samples[name][0][2], samples["llama.cpp"][0][2])) / new,
                "kv_cache": "f32" if cache_bytes[name] == 4 else "bf16",
                "perplexity": perplexities(model, lp, prompt[0].tolist()),
                "loop_weight_bytes": lp.weight_bytes,
                "adopted_forms": sorted(set(report.forms.values())),
                "worst_conversion": report.worst_conversion,
                "refused": [list(x) for x in report.plan.refused]}
        print(f"machine: {machine()}")
        print(f"Qwen3-0.6B-shaped, {args.layers} layers, llama.cpp {args.kquant} file "
              f"{size / 1e6:.1f} MB ({types})")
        for name, m in per_loop.items():
            print(f"{name}: weight bytes/token {m['loop_weight_bytes'] / 1e6:.1f} MB, forms "
                  f"{m['adopted_forms']}, worst conversion {m['worst_conversion']}, refused "
                  f"{len(m['refused'])}")
        print(f"prompt {prompt_len}, {new} new tokens")
        print(f"{'arm':<25}{'prefill tok/s':>14}{'decode tok/s':>14}{'of floor':>10}")
        for r in rows:
            print(f"{r['arm']:<25}{r['prefill_tok_s']:>14.1f}{r['decode_tok_s']:>14.2f}"
                  f"{r['frac_of_floor']:>10.0%}")
        for name, m in per_loop.items():
            ppl = m["perplexity"]
            print(f"{name}: decode {m['decode_vs_llama_cpp']:.2f}x llama.cpp, prefill "
                  f"{m['prefill_vs_llama_cpp']:.2f}x; greedy tokens equal "
                  f"{m['greedy_tokens_equal']:.0%}; perplexity host {ppl['host']:.6g} loop "
                  f"{ppl['decode_loop']:.6g}")
        write_result(result_path(args.json, f"decode_{args.kquant.lower()}"), {
            "bench": "decode_kquant", "machine": machine(), "mix": args.kquant,
            "layers": args.layers, "file_bytes": size, "tensor_types": types,
            "rounds": args.rounds, "prompt": prompt_len, "new_tokens": new, "rows": rows,
            "loops": per_loop,
            "llama_cpp": f"llama-cpp-python {llama_cpp.__version__}; " + llama_isa(llama_cpp)})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


FAMILY_SCHEMES = {"loop_w8": "w8a16_decode", "loop_w4a8": "w4a8_decode"}


def batch_arm(loop, prompts: list[list[int]], new: int):
    """decode_loop over a batch: each sequence prefilled on its own window, then `new - 1` batch
    steps of one row per sequence (every weight read once per step for all of them). Returns
    (prefill seconds, decode seconds, the first sequence's tokens, no brackets): aggregate
    tokens per second is len(prompts) * (new - 1) / decode seconds."""
    t0 = time.perf_counter()
    last = [loop.program.prefill(p, 0, b) for b, p in enumerate(prompts)]
    prefill = time.perf_counter() - t0
    seqs = list(range(len(prompts)))
    first = [last[0]]
    t0 = time.perf_counter()
    for i in range(new - 1):
        last = loop.program.step_batch(last, seqs, [len(p) + i for p in prompts])
        first.append(last[0])
    return prefill, time.perf_counter() - t0, first, []


def llama_family(name: str, model, n_ctx: int, folder: Path, args) -> tuple[dict, str]:
    """llama.cpp on the family's weights at Q8_0 and Q4_0 (the head Q8_0), where
    bench/gguf_export.py writes the family (files under `folder`): {arm: (Llama, file bytes)}
    and what was measured."""
    try:
        import llama_cpp

        from gguf_export import export_gemma3, export_granite
    except ImportError as e:
        return {}, f"not measured: {e}"
    exporters = {"granite": export_granite, "gemma3": export_gemma3}
    if name not in exporters:
        return {}, f"not measured: bench/gguf_export.py writes no {name} file"
    llms = {}
    for quant in ("Q8_0", "Q4_0"):
        path = exporters[name](model, folder / f"{name}-{quant}.gguf", quant)
        llms[f"llama.cpp_{quant}"] = (llama_cpp.Llama(
            model_path=str(path), n_ctx=n_ctx, n_batch=args.prompt, n_threads=os.cpu_count(),
            logits_all=False, verbose=False), path.stat().st_size)
    return llms, (f"llama-cpp-python {llama_cpp.__version__} on the same weights (Q8_0, Q4_0 "
                  "with a Q8_0 head); " + llama_isa(llama_cpp))


def family_run(name: str, args) -> dict:
    """One family of bench/families.py: the host's own forward with its cache (what greedy
    generate does) and the loop over w8a16 and w4a8 seats, alternated round by round; prefill
    and decode apart, each loop's decode held against the bracketing bandwidth probes."""
    from families import FAMILIES

    build, released, depth = FAMILIES[name]
    layers = depth if args.released_depth else args.layers
    model = build(layers)
    cfg = model.config
    prompt_len, new = args.prompt, args.new
    prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len),
                           generator=torch.Generator().manual_seed(1))
    batches = [b for b in args.batch if b > 1]
    loops, batch_loops = {}, {}
    fallbacks = thp_fallbacks()
    # The loops pack first, before llama.cpp's files are written and loaded: packed after them,
    # a 26-layer Gemma 3's w4a8 loop read 25.2 tok/s in one run, packed first 30.5 (its pages
    # were not recorded then). Where the packs lie is recorded now: OLMo 2 packed after Granite
    # in one process had 1175 huge-page faults fall back and read 70% of its floor, not 81%.
    for arm, scheme in FAMILY_SCHEMES.items():
        handle = S.auto_swaps(model, lambda: model(prompt[:, :1]), scheme=scheme).attach(model)
        loops[arm] = S.decode_loop(model, prompt_len + new)
        if batches:
            batch_loops[arm] = S.decode_loop(model, prompt_len + new, batch=max(batches))
        handle.detach()
    pages = {"weight_pages_after_packing": S.ops.weight_pages(),
             "thp_fault_fallbacks_while_packing": thp_fallbacks() - fallbacks}
    # llama.cpp on the same weights where bench/gguf_export.py writes the family.
    folder = Path(tempfile.mkdtemp(prefix="frt-gguf-"))
    llms, peer = llama_family(name, model, prompt_len + new, folder, args)
    # A batch's prompts: the benchmark prompt first (its tokens are the batch-1 arm's), then
    # others of the same length.
    extra = torch.randint(0, cfg.vocab_size, (max(batches, default=1), prompt_len),
                          generator=torch.Generator().manual_seed(2))
    batch_prompts = [prompt[0].tolist()] + extra[1:].tolist()

    def step_bytes(lp):
        return lambda pos: lp.weight_bytes + kv_bytes(cfg, pos, 4)

    arms = {"host": lambda: host_arm(model, prompt, new),
            **{arm: (lambda lp=lp: loop_arm(lp, prompt, new, step_bytes(lp)))
               for arm, lp in loops.items()},
            **{f"{arm}_b{b}": (lambda lp=lp, b=b: batch_arm(lp, batch_prompts[:b], new))
               for arm, lp in batch_loops.items() for b in batches},
            **{arm: (lambda llm=llm, size=size: llama_arm(
                llm, prompt, new, lambda pos: size + kv_bytes(cfg, pos, 2)))
               for arm, (llm, size) in llms.items()}}
    samples: dict[str, list] = {n: [] for n in arms}
    for _ in range(args.rounds):
        for arm, fn in arms.items():
            samples[arm].append(fn())
    host_tokens = samples["host"][0][2]
    host_decode = statistics.median(s[1] for s in samples["host"]) / (new - 1)
    host_prefill = statistics.median(s[0] for s in samples["host"])
    binding = loops["loop_w8"].plan.binding
    ceiling = args.ceiling if batches else None
    print(f"\n{name}: {released} widths, {layers} layers, fp32 random weights, batch 1, "
          f"prompt {prompt_len}, new {new}; binding {binding}")
    print(f"{'arm':<15}{'prefill tok/s':>14}{'vs host':>9}{'decode tok/s':>14}{'vs host':>9}"
          f"{'of floor':>10}{'tokens = host':>15}  (a batch arm: aggregate over its rows)")
    rows = []
    for arm in arms:
        rows_per_step = int(arm.rsplit("_b", 1)[1]) if "_b" in arm else 1
        pre = statistics.median(s[0] for s in samples[arm]) / rows_per_step
        dec = statistics.median(s[1] for s in samples[arm]) / (new - 1) / rows_per_step
        brackets = [b for s in samples[arm] for b in s[3]]
        same = sum(a == b for a, b in zip(samples[arm][0][2], host_tokens)) / new
        base = arm.rsplit("_b", 1)[0]
        # The weights one step reads (the llama.cpp file's bytes, its placeholder vocabulary
        # strings included, ~1%), shared by the rows of a batch step.
        nbytes = (loops[base].weight_bytes if base in loops else llms[arm][1] if arm in llms
                  else host_weight_bytes(model))
        row = {"arm": arm, "batch": rows_per_step, "prefill_tok_s": prompt_len / pre,
               "prefill_speedup_vs_host": host_prefill / pre,
               "weight_bytes_per_step": nbytes, "weight_bytes_per_token": nbytes / rows_per_step,
               "greedy_tokens_same_as_host": same}
        if rows_per_step == 1:
            row["decode_tok_s"] = 1 / dec
            row["decode_speedup_vs_host"] = host_decode / dec
        else:
            # Aggregate tokens/s over the batch (against the host's batch 1 and the same loop's
            # batch 1); the step's compute: a multiply-add per weight per row.
            single = next(r for r in rows if r["arm"] == base)
            row["aggregate_decode_tok_s"] = 1 / dec
            row["aggregate_vs_host_batch1"] = host_decode / dec
            row["aggregate_vs_batch1"] = row["aggregate_decode_tok_s"] / single["decode_tok_s"]
            row["weight_macs_per_step"] = rows_per_step * sum(
                m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
            row["gmac_per_s"] = row["weight_macs_per_step"] / (dec * rows_per_step) / 1e9
            if ceiling is not None:  # int8 products for the a8 schemes, fp32 FMAs for the rest
                unit = "int8_gmacs" if FAMILY_SCHEMES[base].split("_")[0].endswith("a8") \
                    else "fp32_gmacs"
                row["compute_ceiling"] = {"unit": unit, "gmacs": ceiling[unit],
                                          "units": ceiling["units"]}
                row["frac_of_compute_ceiling"] = row["gmac_per_s"] / ceiling[unit]
        if brackets:
            row["floor"] = summarize(brackets)
            row["frac_of_floor"] = row["floor"]["frac_of_bandwidth"]
        rows.append(row)
        fl = f"{row['frac_of_floor']:>10.0%}" if brackets else f"{'-':>10}"
        print(f"{arm:<15}{row['prefill_tok_s']:>14.1f}{row['prefill_speedup_vs_host']:>8.2f}x"
              f"{1 / dec:>14.2f}{host_decode / dec:>8.2f}x{fl}{same:>15.0%}")
    # The first step's logits of each loop against the host's: what a lossy form costs on these
    # weights (greedy tokens part early where random weights leave logits nearly flat).
    with torch.no_grad():
        want = model(prompt).logits[0, -1].double()
    for row in rows:
        lp, llm = loops.get(row["arm"]), llms.get(row["arm"], (None,))[0]
        if lp is not None:
            lp.program.prefill(prompt[0].tolist(), 0)
            got = torch.from_numpy(lp.program.logits()).double()
        elif llm is not None:
            llm.reset()
            llm.eval(prompt[0].tolist())
            got = llama_logits(llm).double()
        else:
            continue
        row["first_logits_cosine"] = float(torch.nn.functional.cosine_similarity(got, want, 0))
        print(f"{row['arm']}: first-step logits cosine {row['first_logits_cosine']:.5f} "
              "against the host's")
    for row in rows:
        if row["batch"] > 1:
            ceil = row.get("compute_ceiling")
            frac = (f", {row['frac_of_compute_ceiling']:.0%} of the {ceil['gmacs']:.0f} GMAC/s "
                    f"{ceil['unit'][:4]} ceiling" if ceil else "")
            print(f"{row['arm']}: aggregate {row['aggregate_vs_batch1']:.2f}x its batch-1 decode, "
                  f"{row['gmac_per_s']:.1f} GMAC/s of weight multiply-adds{frac}")
    for loop_arm_name, peer_arm in (("loop_w8", "llama.cpp_Q8_0"), ("loop_w4a8", "llama.cpp_Q4_0")):
        mine = next((r for r in rows if r["arm"] == loop_arm_name), None)
        theirs = next((r for r in rows if r["arm"] == peer_arm), None)
        if mine and theirs:
            mine[f"decode_vs_{peer_arm}"] = mine["decode_tok_s"] / theirs["decode_tok_s"]
            mine[f"prefill_vs_{peer_arm}"] = mine["prefill_tok_s"] / theirs["prefill_tok_s"]
            print(f"{loop_arm_name}: decode {mine[f'decode_vs_{peer_arm}']:.2f}x {peer_arm}, "
                  f"prefill {mine[f'prefill_vs_{peer_arm}']:.2f}x")
    shutil.rmtree(folder, ignore_errors=True)
    return {"released": released, "layers": layers, "binding": binding, "pages": pages,
            "rows": rows,
            "llama_cpp": peer}


def family_main(args) -> int:
    """Every family asked for, one after another (bench/results/<tier>/decode_families.json);
    llama.cpp on the same weights for the families bench/gguf_export.py writes (Granite,
    Gemma 3)."""
    from families import FAMILIES

    names = list(FAMILIES) if args.family == "all" else args.family.split(",")
    print(f"machine: {machine()}")
    # The compute ceilings of a batch step, measured before any arm and after the last.
    batched = any(b > 1 for b in args.batch)
    before = vector_ceiling(torch.get_num_threads()) if batched else None
    args.ceiling = before
    families = {name: family_run(name, args) for name in names}
    after = vector_ceiling(torch.get_num_threads()) if batched else None
    args.ceiling = bracketed_ceiling(before, after)
    if args.ceiling is not None:  # every batch row against the bracketed ceiling
        for fam in families.values():
            for row in fam["rows"]:
                if "compute_ceiling" in row:
                    unit = row["compute_ceiling"]["unit"]
                    row["compute_ceiling"]["gmacs"] = args.ceiling[unit]
                    row["frac_of_compute_ceiling"] = row["gmac_per_s"] / args.ceiling[unit]
                    print(f"{row['arm']}: {row['frac_of_compute_ceiling']:.0%} of the bracketed "
                          f"{args.ceiling[unit]:.0f} GMAC/s {unit[:4]} ceiling")
    result = {"bench": "decode_families", "machine": machine(), "prompt": args.prompt,
              "new_tokens": args.new, "rounds": args.rounds, "vector_ceiling": args.ceiling,
              "families": families}
    write_result(result_path(args.json, "decode_families"), result)
    return 0


def arm_filter(arms: str) -> Callable[[str], bool]:
    """--arms: 'all', or a comma list; the host always runs (the others are judged against it),
    and attached_w8 needs loop_w8's plan."""
    wanted = None if arms == "all" else set(arms.split(",")) | {"host"}

    def want(arm: str) -> bool:
        return wanted is None or arm in wanted or (arm == "loop_w8" and "attached_w8" in wanted)

    return want


def main() -> int:
    from door import qwen3_06b  # the same host as the door benchmark

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=None,
                        help="default bench/results/<tier>/decode.json (decode_smollm2.json)")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", choices=["qwen3-shaped", "smollm2", "qwen3-kquant"],
                        default="qwen3-shaped")
    parser.add_argument("--kquant", default="Q4_K_M",
                        help="--model qwen3-kquant: llama.cpp's mix (Q4_K_M, Q4_K_S, Q6_K...)")
    parser.add_argument("--arms", default="all",
                        help="'all' or a comma list of arms to run (the host always runs: the "
                             "other arms' tokens and speedups are judged against it)")
    parser.add_argument("--family", default=None,
                        help="'all' or a comma list of bench/families.py hosts (gemma3, phi3, "
                             "olmo2, granite): bench/results/<tier>/decode_families.json")
    parser.add_argument("--prompt", type=int, default=PROMPT,
                        help="prompt tokens (the Qwen3-shaped host, qwen3-kquant and --family)")
    parser.add_argument("--new", type=int, default=NEW,
                        help="--family and qwen3-kquant: new tokens")
    parser.add_argument("--released-depth", action="store_true",
                        help="--family: each family at its released model's layer count (the "
                             "head's share of the bytes as users have it), not --layers")
    parser.add_argument("--batch", type=lambda s: [int(b) for b in s.split(",")], default=[1],
                        help="--family: batch sizes, e.g. 1,4,16 (aggregate tok/s per batch)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    if args.model == "smollm2":
        return smollm2_main(args)
    if args.model == "qwen3-kquant":
        return k_quant_main(args)
    if args.family:
        return family_main(args)

    model = qwen3_06b(args.layers)
    prompt_len = args.prompt  # 128 by default; 512 for the prefill figure (issue 29)
    prompt = torch.randint(0, 151936, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    step = prompt[:, :1]
    max_len = prompt_len + NEW
    loop_schemes = {"loop_w8": "w8a16_decode", "loop_w8_channel": "w8a16_channel_decode",
                    "loop_w4": "w4a16_decode",
                    "loop_w4_sym": "w4a16_sym_decode",
                    "loop_w8a8": "w8a8_decode", "loop_w4a8": "w4a8_decode",
                    "loop_w4a8_asym": "w4a8_asym_decode"}
    want = arm_filter(args.arms)
    plans = {s: S.auto_swaps(model, lambda: model(step), scheme=s)
             for a, s in loop_schemes.items() if want(a) or s == "w8a16_decode"}
    loops = {"loop_none": S.decode_loop(model, max_len)} if want("loop_none") else {}
    for name, scheme in loop_schemes.items():
        if not want(name):
            continue
        h = plans[scheme].attach(model)
        loops[name] = S.decode_loop(model, max_len)
        h.detach()

    def attached(fn):
        def run():
            h = plans["w8a16_decode"].attach(model)
            try:
                return fn()
            finally:
                h.detach()
        return run

    cfg = model.config
    arms = {
        "host": lambda: host_arm(model, prompt, NEW),
        "attached_w8": attached(lambda: host_arm(model, prompt, NEW)),
        # A step reads the weights and the KV cache of every layer (fp32 in the loops).
        **{name: (lambda lp=lp: loop_arm(lp, prompt, NEW,
                                         lambda pos: lp.weight_bytes + kv_bytes(cfg, pos, 4)))
           for name, lp in loops.items()},
    }
    bytes_per_token = {"host": host_weight_bytes(model),
                       **{n: lp.weight_bytes for n, lp in loops.items()}}
    if "loop_w8" in loops:  # the same seats
        bytes_per_token["attached_w8"] = bytes_per_token["loop_w8"]
    peers = {}
    try:
        import tempfile

        import llama_cpp

        from gguf_export import export_qwen3

        gguf_dir = Path(tempfile.mkdtemp(prefix="frt-gguf-"))
        for quant in [q for q in ("Q8_0", "Q4_0") if want(f"llama.cpp_{q}")]:
            path = export_qwen3(model, gguf_dir / f"qwen3-{quant}.gguf", quant)
            llm = llama_cpp.Llama(model_path=str(path), n_ctx=max_len, n_batch=prompt_len,
                                  n_threads=os.cpu_count(), logits_all=False, verbose=False)
            # Every weight is read once per step (the tied embedding is the head), and the KV
            # cache in f16 (llama.cpp's default cache type).
            size = path.stat().st_size
            arms[f"llama.cpp_{quant}"] = lambda llm=llm, size=size: llama_arm(
                llm, prompt, NEW, lambda pos: size + kv_bytes(cfg, pos, 2))
            bytes_per_token[f"llama.cpp_{quant}"] = size
        peers["llama_cpp"] = (f"llama-cpp-python {llama_cpp.__version__}: GGUF written from the "
                              "same weights by the gguf package (Q8_0, Q4_0 with a Q8_0 head); "
                              + llama_isa(llama_cpp))
    except ImportError as e:
        peers["llama_cpp"] = f"not measured: {e} (optional peer: pip install llama-cpp-python gguf)"
    try:
        if not want("torchao_int8"):
            raise ImportError("not in --arms")
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        peer = qwen3_06b(args.layers)  # same seed: the same weights
        assert torch.equal(peer.lm_head.weight, model.lm_head.weight)
        quantize_(peer, Int8WeightOnlyConfig())
        arms["torchao_int8"] = lambda: host_arm(peer, prompt, NEW)
        bytes_per_token["torchao_int8"] = sum(
            m.weight.numel() for m in peer.modules() if isinstance(m, torch.nn.Linear)) + sum(
            m.out_features * 4 for m in peer.modules() if isinstance(m, torch.nn.Linear))
        peers["torchao"] = "int8 weight-only (quantize_, Int8WeightOnlyConfig), eager"
    except ImportError:
        peers["torchao"] = "not installed (optional peer: pip install torchao)"
    arms = {n: fn for n, fn in arms.items() if want(n)}
    samples: dict[str, list] = {n: [] for n in arms}
    host_probes: dict[str, list] = {n: [] for n in arms}
    for _ in range(args.rounds):
        for name, fn in arms.items():
            before = probe()
            samples[name].append(fn())
            host_probes[name].append((before, probe()))
    host_tokens = samples["host"][0][2]
    host_decode = statistics.median(s[1] for s in samples["host"]) / (NEW - 1)
    every_probe = [p for v in host_probes.values() for pair in v for p in pair] + [
        p for v in samples.values() for s in v for b in s[3] for p in (b.before, b.after)]
    best = max(every_probe)
    rows = []
    print(f"machine: {os.cpu_count()} cores, kernels on {S.PARALLEL_BACKEND}; read bandwidth "
          f"probes {min(every_probe):.1f}-{best:.1f} GB/s")
    print(f"Qwen3-0.6B-shaped, {args.layers} layers, fp32, batch 1, prompt {prompt_len}, new {NEW}")
    print(f"of floor: each {SEGMENT}-step segment's bytes (weights, KV cache) per second against "
          "the read bandwidth probed just before and after it, median (Note [Bracketed "
          "bandwidth]); the host arms against the probes around the whole arm")
    print(f"{'arm':<15}{'prefill tok/s':>14}{'decode tok/s':>14}{'vs host':>9}{'of floor':>10}"
          f"{'quartiles':>12}{'tokens = host':>15}")
    mean_kv = {n: kv_bytes(cfg, prompt_len + NEW // 2, 2 if n.startswith("llama.cpp") else 4)
               for n in arms}
    for name in arms:
        pre = statistics.median(s[0] for s in samples[name])
        dec = statistics.median(s[1] for s in samples[name]) / (NEW - 1)
        nbytes = bytes_per_token[name]
        brackets = [b for s in samples[name] for b in s[3]]
        if brackets:
            floor = summarize(brackets)
        else:  # the host arms: the whole decode against the probes around the arm
            fr = [(nbytes + mean_kv[name]) / (s[1] / (NEW - 1)) / ((b0 + b1) / 2 * 1e9)
                  for s, (b0, b1) in zip(samples[name], host_probes[name])]
            floor = {"frac_of_bandwidth": statistics.median(fr),
                     "frac_quartiles": [min(fr), max(fr)], "probes": host_probes[name]}
        same = sum(a == b for a, b in zip(samples[name][0][2], host_tokens)) / NEW
        row = {"arm": name, "prefill_tok_s": prompt_len / pre, "prefill_seconds": pre,
               "decode_tok_s": 1 / dec, "decode_step_seconds": dec,
               "decode_speedup_vs_host": host_decode / dec, "weight_bytes_per_token": nbytes,
               "kv_bytes_per_step_mean": mean_kv[name],
               "frac_of_floor": floor["frac_of_bandwidth"], "floor": floor,
               # against the best probe of the whole run: a transient no arm saw throughout
               "frac_of_best_probe_floor": (1 / dec) * (nbytes + mean_kv[name]) / (best * 1e9),
               "greedy_tokens_same_as_host": same}
        rows.append(row)
        q = floor["frac_quartiles"]
        print(f"{name:<15}{row['prefill_tok_s']:>14.1f}{row['decode_tok_s']:>14.2f}"
              f"{row['decode_speedup_vs_host']:>8.2f}x{row['frac_of_floor']:>10.0%}"
              f"{f'{q[0]:.0%}-{q[1]:.0%}':>12}{same:>15.0%}")
    # Teacher-forced top-1 agreement: every loop fed the host's own greedy sequence, its argmax
    # after each prefix against the host's, over the generated positions.
    seq = torch.tensor([prompt[0].tolist() + host_tokens[:-1]])
    with torch.no_grad():
        host_next = model(seq).logits[0].argmax(-1).tolist()
    agreement = {}
    for name, lp in loops.items():
        mine = lp.teacher_forced(seq)
        span = range(prompt_len - 1, seq.shape[1])
        agreement[name] = sum(mine[i] == host_next[i] for i in span) / len(span)
        next(r for r in rows if r["arm"] == name)["teacher_forced_top1"] = agreement[name]
    print("teacher-forced top-1 agreement with the host: " +
          ", ".join(f"{k} {v:.3f}" for k, v in agreement.items()))
    print(f"peers: {peers}")
    result = {"machine": machine(), "best_probe_gbps": best,
              "layers": args.layers, "prompt": prompt_len, "new_tokens": NEW, "rounds": args.rounds,
              "rows": rows, "peers": peers}
    write_result(result_path(args.json, "decode"), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

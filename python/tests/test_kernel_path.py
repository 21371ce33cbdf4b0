"""The kernel path seen from Python: `python -m flashrt_structures kernels`, the unavailable
report, and a broken or missing package never crashing a host. Each case runs in a fresh
interpreter because the kernel path is read from the environment once per process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import flashrt_structures as frt
from flashrt_structures import impls

BUNDLED = frt.BUNDLED_KERNELS


def run_module(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FRT_KERNEL_REV_")}
    full_env.pop("LOCAL_KERNELS", None)
    full_env.pop("FLASHRT_KERNEL_PATH", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "flashrt_structures", *args],
        capture_output=True, text=True, env=full_env, timeout=120,
    )


def kernels_json(env: dict[str, str] | None = None) -> dict:
    proc = run_module("kernels", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def stage(tmp_path: Path, repo: str = "flashrt/linear") -> Path:
    """A copy of a bundled package under tmp_path/root/<repo>."""
    dst = tmp_path / "root" / repo
    shutil.copytree(BUNDLED / repo, dst)
    return dst


def withheld(entry: dict) -> bool:
    """A better build refused because Linux refused this process a feature the CPU has (AMX's
    tile data): reported though a lesser build serves."""
    return entry["error"].startswith("build variant withheld")


def test_bundled_packages_choose_the_best_variant_this_cpu_runs():
    report = kernels_json()
    tier = report["cpu"]["tier"]
    # The amx build also needs AVX512-BF16 (its bf16 stores): every AMX CPU has it, but a guest
    # may mask it, and then avx512vnni serves with the refusal reported.
    amx_runs = tier == "amx" and "avx512_bf16" in report["cpu"]["features"]
    if tier != "amx" or amx_runs:
        assert [e for e in report["unavailable"] if not withheld(e)] == []
    for p in report["packages"]:
        assert p["source"] == "bundled"
        # Only flashrt/gemm has an amx build: on an AMX CPU the others serve avx512vnni.
        isas = {v["isa"] for v in p["variants"]}
        want = tier if tier in isas and (tier != "amx" or amx_runs) else "avx512vnni"
        assert p["chosen"] == f"cpu-x86_64-linux-{want}"
        if amx_runs:
            assert p["repo"] != "flashrt/gemm" or want == "amx"
        refused = {v["name"]: v["reason"] for v in p["variants"] if not v["chosen"]}
        if tier == "avx2":
            assert "variant needs avx512f, this CPU has avx2" in refused[
                "cpu-x86_64-linux-avx512vnni"]


def test_text_report_names_packages_variants_and_choice():
    proc = run_module("kernels")
    assert proc.returncode == 0
    assert "flashrt/linear" in proc.stdout and "flashrt/ffn" in proc.stdout
    assert "chosen: cpu-x86_64-linux-" in proc.stdout
    if not [e for e in kernels_json()["unavailable"] if withheld(e)]:
        assert "unavailable: none" in proc.stdout


def test_cpu_cap_selects_the_generic_variant():
    report = kernels_json({"FRT_CPU_CAP": "generic"})
    assert {p["chosen"] for p in report["packages"]} == {"cpu-x86_64-linux-generic"}


def test_corrupt_metadata_is_reported_not_crashed_on(tmp_path):
    pkg = stage(tmp_path)
    (pkg / "metadata.json").write_text('{"name": "flashrt/linear", "variants": [')
    report = kernels_json({"FLASHRT_KERNEL_PATH": str(tmp_path / "root")})
    rows = [e for e in report["unavailable"] if e["repo"] == "flashrt/linear"]
    assert rows and rows[0]["error"] == "corrupt metadata"
    # The other package still loads from the bundled root.
    ffn = next(p for p in report["packages"] if p["repo"] == "flashrt/ffn")
    assert ffn["chosen"]


def test_other_architecture_and_missing_library_are_named(tmp_path):
    pkg = stage(tmp_path)
    meta = json.loads((pkg / "metadata.json").read_text())
    meta["variants"] = [v for v in meta["variants"] if v["isa"] in ("generic", "avx2")]
    meta["variants"][0].update(name="cpu-aarch64-linux-generic", arch="aarch64")
    (pkg / meta["variants"][1]["library"]).unlink()
    (pkg / "metadata.json").write_text(json.dumps(meta))
    report = kernels_json({"LOCAL_KERNELS": f"flashrt/linear={pkg}"})
    row = next(e for e in report["unavailable"] if e["repo"] == "flashrt/linear")
    assert row["error"] == "no build variant for this host"
    assert "CPU (aarch64) does not match system CPU (x86_64)" in row["detail"]
    assert "library file missing" in row["detail"]


def test_pin_to_an_absent_revision_is_refused(tmp_path):
    report = kernels_json({"FRT_KERNEL_REV_FLASHRT_LINEAR": "0000deadbeef"})
    row = next(e for e in report["unavailable"] if e["repo"] == "flashrt/linear")
    assert row["error"] == "pinned revision not found"
    assert "0000deadbeef" in row["detail"]


def test_a_missing_kernel_package_raises_kernel_unavailable_in_a_host(tmp_path):
    pkg = stage(tmp_path)
    (pkg / "metadata.json").write_text("not json")
    code = (
        "import torch, flashrt_structures as f\n"
        "from flashrt_structures import ops, impls\n"
        "p = ops.pack_int8(torch.randn(16, 32))\n"
        "try:\n"
        "    ops.linear(torch.randn(1, 32), p)\n"
        "except f.KernelUnavailable as e:\n"
        "    assert isinstance(e, ValueError)\n"
        "    print('unavailable:', impls.unavailable_report()[0]['error'])\n"
    )
    env = dict(os.environ, FLASHRT_KERNEL_PATH=str(tmp_path / "root"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "unavailable: corrupt metadata" in proc.stdout


def test_report_api_in_process():
    report = impls.kernels_report()
    assert report["threads"] >= 1
    assert impls.resolve("flashrt/linear").available
    assert not impls.resolve("flashrt/nonexistent").available
    assert any(e["repo"] == "flashrt/nonexistent" and "not found on the kernel path" in e["error"]
               for e in impls.unavailable_report())
    impls.clear_unavailable_report()
    assert impls.unavailable_report() == []
    impls.resolve("flashrt/gemm")  # a withheld AMX build is its only possible row
    assert [e for e in impls.unavailable_report() if not withheld(e)] == []


@pytest.mark.parametrize("args", [["--help"], ["kernels", "--help"]])
def test_cli_help(args):
    assert run_module(*args).returncode == 0


def stage_with_bad_bytes(tmp_path: Path) -> Path:
    """A copy of flashrt/linear whose metadata.json holds a byte that is not UTF-8 (0xff) in its
    version string."""
    pkg = stage(tmp_path)
    raw = (pkg / "metadata.json").read_bytes()
    bad, n = re.subn(rb'"version": "([^"]*)"', lambda m: b'"version": "' + m[1] + b'\xff"', raw)
    assert n == 1, raw
    (pkg / "metadata.json").write_bytes(bad)
    return pkg


def test_metadata_bytes_that_are_not_utf8_are_refused_printably(tmp_path):
    # Issue 13: the refusal used to carry the raw byte into Python, and the report raised
    # UnicodeDecodeError instead of listing the package.
    pkg = stage_with_bad_bytes(tmp_path)
    env = {"LOCAL_KERNELS": f"flashrt/linear={pkg}"}
    report = kernels_json(env)
    row = next(e for e in report["unavailable"] if e["repo"] == "flashrt/linear")
    assert row["error"] == "corrupt metadata"
    assert f"{pkg}/metadata.json: invalid JSON" in row["detail"]
    assert "\\xff" in row["detail"] and row["detail"].isprintable()
    # The other packages still serve from the bundled root.
    served = {p["repo"]: p["chosen"] for p in report["packages"]}
    assert served["flashrt/linear"] == ""
    assert served["flashrt/ffn"] and served["flashrt/decode"]

    proc = run_module("kernels", env=env)
    assert proc.returncode == 0, proc.stderr
    refusal = next(line for line in proc.stdout.splitlines()
                   if line.startswith("unavailable:") and "flashrt/linear" in line)
    assert "corrupt metadata" in refusal
    assert "\\xff" in proc.stdout


@pytest.mark.slow
def test_a_host_still_plans_and_decodes_past_a_package_with_bad_bytes(tmp_path):
    pkg = stage_with_bad_bytes(tmp_path)
    code = (
        "import sys, json, torch\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import hosts, flashrt_structures as S\n"
        "from flashrt_structures import impls\n"
        "m = hosts.qwen3(1); x = hosts.ids(3)\n"
        "plan = S.auto_swaps(m, lambda: m(x), scheme='w8a16_decode', min_seat_weights=0)\n"
        "text = S.explain(plan)\n"
        "out = S.decode_loop(m, max_len=32).generate(x, max_new_tokens=3)\n"
        "gated = S.attach(m, lambda: m(x), rounds=1, iters=1)\n"
        "linear_seats = sum(c['seats'] for n_, u in gated.units.items()\n"
        "                   if n_ not in ('norm_fused', 'attention_core', 'rotary_embed')\n"
        "                   for n, c in u.get('candidates', {}).items() if n == 'w8a16_decode')\n"
        "print(json.dumps({'swaps': sorted(plan.swaps), 'explain': text,\n"
        "  'unavailable': impls.unavailable_report(), 'generated': out.shape[1],\n"
        "  'gated_scheme': gated.notes['scheme']['name'],\n"
        "  'gated_units': sorted(u for u in gated.units if u != 'union'),\n"
        "  'w8a16_seats': linear_seats,\n"
        "  'seated': [r['site'] for r in gated.handle.report()] if gated.active else [],\n"
        "  'refused': [p for p, _ in gated.notes['refused']]}))\n"
        "gated.detach()\n"
    )
    env = dict(os.environ, LOCAL_KERNELS=f"flashrt/linear={pkg}")
    env.pop("FLASHRT_KERNEL_PATH", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # flashrt/ffn serves the feed-forward seam and flashrt/decode the norms, the attention and
    # the rotary;
    # the projections and the head, which need flashrt/linear, are refused naming it.
    assert out["swaps"] == ["model.layers.0.input_layernorm", "model.layers.0.mlp",
                            "model.layers.0.post_attention_layernorm", "model.layers.0.self_attn",
                            "model.layers.0.self_attn.k_norm", "model.layers.0.self_attn.q_norm",
                            "model.norm", "model.rotary_emb"]
    assert "flashrt/linear" in out["explain"]
    row = next(e for e in out["unavailable"] if e["repo"] == "flashrt/linear")
    assert row["error"] == "corrupt metadata" and "\\xff" in row["detail"]
    assert out["generated"] == 3 + 3  # decode_loop runs on flashrt/decode
    # The gated door's auto measures every gated_auto candidate: under w8a16_decode only the
    # feed-forward (flashrt/ffn) has a seat to measure, its projections and head being refused
    # for flashrt/linear, while the flashrt/gemm candidates reach the projections too.
    assert out["gated_scheme"] == "auto"
    assert out["w8a16_seats"] == 1
    assert {"linear_proj", "lm_head", "decoder_ffn"} <= set(out["gated_units"])
    # A module one candidate refused and another seated is seated, not listed as refused.
    assert not set(out["seated"]) & set(out["refused"])


def test_an_error_message_with_bytes_that_are_not_utf8_keeps_its_class(tmp_path):
    # The binding's last line of defence: a message quoting a file name that is not UTF-8 is
    # escaped, and stays a ValueError rather than becoming a UnicodeDecodeError.
    from flashrt_structures import _core

    cat = tmp_path / "cat"
    shutil.copytree(Path(frt.__file__).parent / "catalog", cat)
    # In every folder of the catalog, so the loader meets it whichever folders it reads.
    for folder in [cat, *(p for p in cat.rglob("*") if p.is_dir())]:
        with open(os.path.join(os.fsencode(folder), b"\xff.yaml"), "wb") as f:
            f.write(b"name: odd\nbogus_field: 1\n")
    with pytest.raises(ValueError) as info:
        _core.load_catalog(str(cat))
    # UnicodeDecodeError is a ValueError too: what it used to raise.
    assert not isinstance(info.value, UnicodeDecodeError), info.value
    assert "\\xff.yaml" in str(info.value)

"""What the vLLM door cannot seat is refused per site with its reason, and the engine still
serves: tensor parallel > 1, a quantized checkpoint (the expert banks' refusals are in
test_vllm_moe.py)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from flashrt_structures import vllm_engine

from conftest import engine, generate, prompts


def test_tensor_parallel_is_refused_in_every_worker(qwen3_dir, hook_off, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")  # one core per rank (one NUMA node)
    vllm_engine.install_load_hook(scheme="w8a16_decode")
    with engine(qwen3_dir, multiprocess=True, tensor_parallel_size=2) as llm:
        tokens, _ = generate(llm, prompts(1), steps=2)
        reports = vllm_engine.report(llm)
    assert len(tokens[0]) == 2
    assert len(reports) == 2 and len({r["pid"] for r in reports}) == 2
    for rep in reports:
        assert rep["hooked"] and rep["seats"] == 0 and rep["active"]
        assert rep["refused"]
        for _site, why in rep["refused"]:
            assert "tensor parallel size 2" in why


def _int8_checkpoint(src, dst) -> None:
    """The same Qwen3 as a compressed-tensors W8A8 int8 checkpoint (int8 weights with a scale
    per output channel, dynamic per-token activations; the head left unquantized)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file
    tensors = load_file(str(src / "model.safetensors"))
    out = {}
    for name, t in tensors.items():
        if name.endswith("_proj.weight"):
            scale = t.abs().amax(dim=1, keepdim=True) / 127
            out[name] = torch.round(t / scale).clamp(-127, 127).to(torch.int8)
            out[name.replace(".weight", ".weight_scale")] = scale.float()
        else:
            out[name] = t
    dst.mkdir(exist_ok=True)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                        "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                                  "strategy": "token", "dynamic": True}}}}
    (dst / "config.json").write_text(json.dumps(cfg))
    shutil.copy(src / "generation_config.json", dst / "generation_config.json")


def int8_checkpoint_dtype(shapes: list[tuple[int, int]]) -> str:
    """The activation dtype vLLM's own CPU path for a W8A8 int8 checkpoint runs in on this CPU.

    vLLM picks that path per layer (`check_cpu_sgl_kernel`): where the CPU has AMX tiles and the
    shape fits the tile, its AMX int8 kernel, which takes bf16 or fp16 activations only ("expect A
    to be bfloat16 or half"); elsewhere oneDNN, which also takes fp32. The engine runs in the
    dtype every layer's path accepts, so the test states the same thing on every CPU."""
    from vllm.model_executor.layers.utils import check_cpu_sgl_kernel
    amx = [check_cpu_sgl_kernel(n, k, torch.int8) for n, k in shapes]
    return "bfloat16" if any(amx) else "float32"


def test_int8_checkpoint_dtype_follows_vllms_own_kernel_choice():
    """The dtype above is vLLM's answer for this CPU, not an assumption: with AMX tiles the
    AMX-sized shapes need bf16, without them every shape runs in fp32."""
    amx = torch.cpu._is_amx_tile_supported()
    assert int8_checkpoint_dtype([(256, 256)]) == ("bfloat16" if amx else "float32")
    assert int8_checkpoint_dtype([(15, 256)]) == "float32"  # below one AMX tile: oneDNN


def test_quantized_checkpoint_is_refused(qwen3_dir, tmp_path, hook_off):
    _int8_checkpoint(qwen3_dir, tmp_path / "int8")
    shapes = [(int(t.shape[0]), int(t.shape[1])) for name, t in
              load_file(str(tmp_path / "int8" / "model.safetensors")).items()
              if name.endswith("_proj.weight")]
    dtype = int8_checkpoint_dtype(shapes)
    vllm_engine.install_load_hook(scheme="w8a16_decode")
    with engine(tmp_path / "int8", multiprocess=False, dtype=dtype) as llm:
        # The refusal is read before anything runs: the hook decided at load.
        (before,) = vllm_engine.report(llm)
        assert before["hooked"] and before["seats"] == 0 and before["refused"]
        tokens, _ = generate(llm, prompts(1), steps=2)
        (rep,) = vllm_engine.report(llm)
    assert len(tokens[0]) == 2  # the engine serves on vLLM's own int8 path
    assert rep["hooked"] and rep["seats"] == 0 and rep["active"]
    assert rep["refused"] == before["refused"]
    sites = dict(rep["refused"])
    assert "model.layers.0.self_attn.qkv_proj" in sites
    for why in sites.values():
        assert "quantized checkpoint (compressed-tensors)" in why and "adopt_prequantized" in why

"""Checkpoints for the serving-engine doors' tests (python/tests_vllm, python/tests_sglang), written
by `save_pretrained` from config classes with random weights: the small sizes and the int8 grid on
which a seated engine must reproduce the plain engine's tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

SMALL = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             max_position_embeddings=512)


def on_int8_grid(w: torch.Tensor) -> torch.Tensor:
    """Random weights moved onto the int8 per-output-channel grid: each row is a power-of-two
    scale times integers in [-127, 127], its largest magnitude exactly 127. Exact in fp32 and
    bf16, and packed by w8a16_channel_decode without loss, so a seated engine must give the
    plain engine's tokens step for step. (Off the grid, random models have near-ties, top-2 logit
    gaps of 0.005 of the logits' spread, that int8 rounding flips; the off-grid checkpoint is
    measured by cosine.)"""
    amax = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-8)
    scale = torch.exp2(torch.floor(torch.log2(amax / 127)))
    k = torch.clamp(torch.round(w / scale), -127, 127)
    top = k.abs().argmax(dim=1, keepdim=True)
    k.scatter_(1, top, torch.where(k.gather(1, top) < 0, -127.0, 127.0))
    return k * scale


def save(cls, cfg, path: Path, grid: bool) -> Path:
    """Random weights from the config class, with grid: every matrix on the int8 grid (a bank
    [experts, out, in] per expert's output channel)."""
    torch.manual_seed(0)
    model = cls(cfg).float()
    if grid:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.copy_(on_int8_grid(p.reshape(-1, p.shape[-1])).reshape(p.shape))
    model.save_pretrained(path)
    return path


# The engine doors' checkpoints, one per session (each engine conftest imports these fixtures).
@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory) -> Path:
    """Qwen3, separate head, weights on the int8 grid."""
    return save(Qwen3ForCausalLM, Qwen3Config(**SMALL, tie_word_embeddings=False),
                tmp_path_factory.mktemp("qwen3"), grid=True)


@pytest.fixture(scope="session")
def qwen3_gauss_dir(tmp_path_factory) -> Path:
    """Qwen3, separate head, the config class's own random initialisation."""
    return save(Qwen3ForCausalLM, Qwen3Config(**SMALL, tie_word_embeddings=False),
                tmp_path_factory.mktemp("qwen3_gauss"), grid=False)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    """Llama, head tied to the token embedding, weights on the int8 grid."""
    return save(LlamaForCausalLM, LlamaConfig(**SMALL, tie_word_embeddings=True),
                tmp_path_factory.mktemp("llama"), grid=True)

"""Real vLLM engines (vllm-cpu, `.venv-vllm`: scripts/setup_vllm.sh) over checkpoints written by
`save_pretrained` from config classes with random weights."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the machine is shared

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup_vllm.sh)")
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from flashrt_structures import vllm_engine  # noqa: E402

SMALL = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             max_position_embeddings=512)


def on_int8_grid(w: torch.Tensor) -> torch.Tensor:
    """Random weights moved onto the int8 per-output-channel grid: each row is a power-of-two
    scale times integers in [-127, 127], its largest magnitude exactly 127. Exact in fp32 and
    bf16, and packed by w8a16_channel_decode without loss, so a seated engine must give plain
    vLLM's tokens step for step. (Off the grid, random models have near-ties, top-2 logit gaps
    of 0.005 of the logits' spread, that int8 rounding flips; the off-grid checkpoint is
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


def prompts(n: int, seed: int = 1) -> list[dict[str, Any]]:
    """n prompts of 18..40 tokens: their prefill is beyond the decode band (16 rows)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(18, 41, (1,), generator=g))
        out.append({"prompt_token_ids": torch.randint(1, 1000, (length,), generator=g).tolist()})
    return out


@contextlib.contextmanager
def engine(model: Path, *, multiprocess: bool, **kw) -> Iterator[Any]:
    """One vLLM engine, torn down after the block so the next one has the memory."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
    args = dict(model=str(model), skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
                max_model_len=256, logprobs_mode="raw_logits", max_logprobs=-1, seed=0)
    args.update(kw)
    llm = vllm.LLM(**args)
    try:
        yield llm
    finally:
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def _logits(step: dict) -> torch.Tensor:
    """One step's raw logits from vLLM's logprobs (max_logprobs=-1: every token)."""
    logits = torch.full((len(step),), float("nan"), dtype=torch.float64)
    for tok, lp in step.items():
        logits[tok] = lp.logprob
    return logits


def generate(llm: Any, batch: list[dict[str, Any]], steps: int = 16, every_step: bool = False
             ) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy tokens per prompt, and each prompt's full logits at the first step ([vocab]) or,
    with every_step, at every step ([steps, vocab])."""
    sp = vllm.SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True, logprobs=-1)
    outs = llm.generate(batch, sp, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    if every_step:
        return tokens, [torch.stack([_logits(s) for s in o.outputs[0].logprobs]) for o in outs]
    return tokens, [_logits(o.outputs[0].logprobs[0]) for o in outs]


@pytest.fixture
def hook_off():
    """Each test starts and ends with no request in the environment."""
    vllm_engine.uninstall_load_hook()
    yield
    vllm_engine.uninstall_load_hook()

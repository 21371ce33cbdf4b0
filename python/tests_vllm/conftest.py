"""Real vLLM engines (vllm-cpu, `.venv-vllm`: scripts/setup_vllm.sh) over checkpoints written by
`save_pretrained` from config classes with random weights."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Plans read the catalog's bands, never a decisions file a `tune` run left on this machine
# (flashrt_structures.decisions); the tests of that file name theirs.
os.environ["FLASHRT_DECISIONS"] = "off"

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the machine is shared

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup_vllm.sh)")
import torch  # noqa: E402

# The engine doors' shared checkpoints live beside the main tests (appended: no shadowing).
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))
from flashrt_structures import vllm_engine  # noqa: E402

# The checkpoint fixtures, and SMALL and save for the tests that write their own.
from engine_checkpoints import (  # noqa: E402, F401
    SMALL,
    llama_dir,
    qwen3_dir,
    qwen3_gauss_dir,
    save,
)


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

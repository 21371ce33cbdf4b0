"""The vLLM door: seats on vLLM's own layers, installed where the engine loads its model.

vLLM runs the model in its engine core, by default a spawned child process that re-imports vLLM
and knows nothing of what the parent patched. The door therefore travels two ways:

* `install_load_hook()` (parent, before `LLM(...)`) writes the request to the environment
  (`FLASHRT_VLLM`, inherited by the child) and patches this process too (the in-process engine,
  `VLLM_ENABLE_V1_MULTIPROCESSING=0`);
* the `vllm.general_plugins` entry point `flashrt` (pyproject.toml), which vLLM loads in every one
  of its processes, runs `_plugin()`: it patches the loader only where the request is in the
  environment, and always gives vLLM's workers a read-only `flashrt_report` method, so the parent
  can ask the process that runs the model what happened (`report(llm)`, `attached(llm)`), through
  vLLM's own `collective_rpc`.

One job per module:

* `adapters`: seats standing for vLLM's layers (`EngineSeat`, the head in its quant method) and
  the seat set built from a plan;
* `tree`: reading the engine's model in the window (whole-engine refusals, the tree described and
  the weights held, the observed forward, the layers no structure describes);
* `banks`: vLLM's fused expert banks (`FusedMoE`'s `routed_experts`): recognised, refused by what
  the bank op cannot take, described as banks of experts, measured, and seated as their quant
  method's `apply`, fed by vLLM's own routing (Note [The bank in the window]);
* `hook`: the request in the environment, the loader's wrap, the record of each hooked model;
* `plugin`: the entry point and the workers' `flashrt_report` / `flashrt_select`;
* `door`: `install_load_hook()` / `uninstall_load_hook()` in the user's process;
* `reports`: `report`, `attached`, `select`, `receipt`, `save_receipt` through `collective_rpc`.

vLLM is optional: no module here imports it at import time (each reaches it inside the function
that runs in vLLM's process).

Note [The window on CPU]: vLLM's loader calls `process_weights_after_loading` once the checkpoint
is in; on CPU `UnquantizedLinearMethod` then hands each projection's weight to oneDNN (or its own
packed GEMM) and leaves `layer.weight` empty. The hook wraps that call: before it, the tree is
described and each projection's weight is held by reference (no copy); after it, the host is
complete, one real forward (one token, the engine's profiling form: no attention metadata) and one
`compute_logits` are observed, the core plans, seats are packed from the held weights, which are
then let go, and the seats are attached. Prefill (rows beyond the band) runs vLLM's own oneDNN path.
"""

from __future__ import annotations

from .adapters import HEAD_ATTR as HEAD_ATTR
from .adapters import EngineSeat
from .door import install_load_hook, uninstall_load_hook
from .hook import ENV
from .plugin import PLUGIN as PLUGIN
from .plugin import PLUGIN_GROUP as PLUGIN_GROUP
from .plugin import _plugin as _plugin  # the entry point: flashrt_structures.vllm_engine:_plugin
from .reports import attached, receipt, report, save_receipt, select

__all__ = ["ENV", "EngineSeat", "attached", "install_load_hook", "receipt", "report",
           "save_receipt", "select", "uninstall_load_hook"]

"""The SGLang door: seats on SGLang's own layers, installed where its scheduler loads the model.

SGLang runs the model in a spawned scheduler process that re-imports SGLang and knows nothing of
what the parent patched. The door therefore travels two ways:

* `install()` (user's process, before `sglang.Engine(...)`) checks that the hook can reach that
  process and writes the request to the environment (`FLASHRT_SGLANG`, inherited by the child);
* the `sglang.srt.plugins` entry point `flashrt` (pyproject.toml), which SGLang loads in every one
  of its processes, runs `_plugin()`: it wraps the loader only where the request is in the
  environment, and always gives SGLang's `Scheduler` the read-only `flashrt_report` and the
  `flashrt_select` methods, which the user's process reaches through the engine's own
  `collective_rpc` (`report(engine)`, `attached(engine)`, `select(engine, scheme)`).

One job per module:

* `adapters`: the seat standing for SGLang's linear layers and the head placed in its logits
  processor;
* `tree`: reading the engine's model in the window (whole-engine refusals, the tree described and
  the weights held, each projection's observed call, the layers no structure describes);
* `hook`: the request in the environment, the loader's wrap, the record of each hooked model;
* `plugin`: the entry point and the scheduler's `flashrt_report` / `flashrt_select`;
* `door`: `install()` / `uninstall()` in the user's process;
* `reports`: `report`, `attached`, `select`, `receipt`, `save_receipt` through `collective_rpc`.

SGLang is optional: no module here imports it at import time.

Note [The window in SGLang]: SGLang's `DefaultModelLoader.postprocess_weights` runs each layer's
`quant_method.process_weights_after_loading` once the checkpoint is in. On a CPU without
SGLang's compiled kernels (`sgl_kernel` built with AMX) it changes nothing: the linears keep
their weight and call `F.linear`. Where those kernels are present it repacks the weights in place
for them (`use_intel_amx_backend`). The hook wraps that call: before it, the tree is described
and each projection's weight is held by reference (no copy); after it, a layer SGLang repacked is
refused by name (its own kernel stays; the door does not seat over it), each other projection is
called once on one row and the head's logits once (observed), the core plans, seats are packed
from the held weights, and the seats are attached. Prefill chunks (rows beyond the band) run
SGLang's own path as band dispatches, counted in the ledger.
"""

from __future__ import annotations

from .door import install, uninstall
from .hook import ENV
from .plugin import PLUGIN as PLUGIN
from .plugin import PLUGIN_GROUP as PLUGIN_GROUP
from .plugin import _plugin as _plugin  # the entry point: flashrt_structures.sglang_engine:_plugin
from .reports import attached, receipt, report, save_receipt, select

__all__ = ["ENV", "attached", "install", "receipt", "report", "save_receipt", "select",
           "uninstall"]

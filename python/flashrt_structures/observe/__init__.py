"""Observation: turns `model, forward` into the core's neutral HostGraph.

What is recorded is structural: module kinds, slot tensors (shape, dtype, identity), what an
activation module computes (measured, not read from its class), and what one real forward showed
(rows per call, dtypes, which calls shared a tensor, call order). Nothing is matched on type or
model names; the planner in the core does the matching.

* `probes`: what a module computes, measured (activations, norms, modulation);
* `tree`: the module tree and the host's configuration as a HostGraph, and which modules to hook;
* `calls`: the forwards run with those hooks (`CallRecorder`), their calls added to the graph;
* `functions`: modules that call a recurrence or convolution function of their namespace, the
  functions measured, and their calls recorded while the forwards run (`FunctionWatch`).
* `attention`: modules that call the host's attention interface, their calls recorded through a
  router registered in it (`AttentionWatch`; the seats route through it too).
* `sequence_attention`: modules whose forward calls torch's scaled_dot_product_attention over
  whole sequences themselves (diffusers' attention processors), their calls attributed to the
  module running (`SequenceWatch`).
* `blocks`: decoder layers (two norms, an attention and a feed-forward as children), how their
  call composes them, measured on one more run of the first forward.
* `rotary`: the rotary function attention modules call with their model's cos and sin, measured,
  its calls attributed to the rotary module whose tables they carry (`RotaryWatch`).
"""

from __future__ import annotations

from torch import nn

from .. import _core
from .attention import AttentionWatch
from .blocks import watch_blocks
from .calls import CallRecorder, Forward, host_call, normalise_forwards, record_calls
from .calls import _first_tensor as _first_tensor  # the vLLM door's seats unwrap (out, bias)
from .functions import FunctionWatch
from .probes import (
    dtype_of,
    fit_modulation,
    measure_activation,
    measure_bare_norm,
    measure_norm,
    measure_wrapped,
)
from .rotary import RotaryWatch
from .routing import measure_routers
from .sequence_attention import SequenceWatch
from .tree import config_facts, describe_tree, engine_projection


def observe(model: nn.Module, forwards: list[Forward]) -> _core.HostGraph:
    """The tree and what the forwards showed: rows, dtypes and which calls shared a tensor."""
    graph, hooked = describe_tree(model)
    watch = FunctionWatch(model, graph)
    attention = AttentionWatch(model, graph)
    rotary = RotaryWatch(model, graph)
    sequence = SequenceWatch(model, graph)
    with watch.watching(), attention.watching(), rotary.watching(), sequence.watching():
        record_calls(graph, hooked, forwards, model)
    watch.write()
    attention.write()  # before `sequence`: a module the interface serves is its node
    sequence.write()
    rotary.write()
    watch_blocks(model, graph, forwards[0])  # needs the kinds the watches above wrote
    measure_routers(model, graph)  # a routed layer's block runs its router
    return graph


__all__ = [
    "CallRecorder", "Forward", "config_facts", "describe_tree", "dtype_of", "engine_projection",
    "fit_modulation", "host_call", "measure_activation", "measure_bare_norm", "measure_norm",
    "measure_wrapped", "normalise_forwards", "observe", "record_calls",
]

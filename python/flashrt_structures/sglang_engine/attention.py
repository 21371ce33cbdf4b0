"""Attention seats in SGLang's torch-native backend: a RadixAttention layer's decode batch served
by the core's paged attention over SGLang's own pool (Note [Paged attention] in
kernels/decode/src/decode_ops.cpp), in one call for every row, where the backend gathers each
request's keys and values into a copy and calls torch's attention request by request.

The layer keeps its projections, rotary, its pool and the write of the step's keys and values
into it (done here exactly as the backend does it, then the op reads the pool in place). An extend
(prefill) batch is SGLang's own, counted as a band dispatch; a batch the op cannot take (encoder
positions, a table it refuses) runs the backend's own decode, counted with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from .. import _core
from ..function_seats import FunctionSeat
from ..seats import RAN

# The backend whose decode batch the seats serve, as SGLang's configuration names it.
BACKEND = "torch_native"

# layer -> its seat, while placed (undo() takes it out); the backend's methods route each layer's
# batch through here.
_SEATS: dict[nn.Module, PagedAttentionSeat] = {}
_ORIGINALS: dict[str, Callable[..., Any]] = {}


def is_layer(mod: nn.Module) -> bool:
    """SGLang's attention layer (it holds no weight; the backend computes its calls)."""
    from sglang.srt.layers.radix_attention import RadixAttention
    return isinstance(mod, RadixAttention)


def backend_refusal() -> str:
    """Why no attention layer of this engine can be seated, or "": the seats stand in the
    torch-native backend's decode, so SGLang must decode with that backend."""
    try:
        from sglang.srt.runtime_context import attention_backends
        prefill, decode = attention_backends()
    except Exception as e:  # noqa: BLE001 - unread is refused: the seat would never be called
        return f"SGLang's attention backend could not be read ({type(e).__name__}: {e})"
    if decode != BACKEND:
        return (f"SGLang decodes with attention backend {decode!r}; the attention seat stands in "
                f"the {BACKEND!r} backend's decode batch")
    return ""


def facts_of(layer: Any) -> _core.AttentionFacts:
    """The layer's attention as it declares it (SGLang's attention needs a scheduled batch to be
    called, so it is read, not observed; the core checks every served call). A layer the
    torch-native backend computes in a way the op does not is form `other`, with what it
    declared."""
    f = _core.AttentionFacts()
    f.heads, f.kv_heads = int(layer.tp_q_head_num), int(layer.tp_k_head_num)
    f.head_dim = int(layer.qk_head_dim)
    f.scale = float(layer.scaling)
    f.implementation = f"sglang {BACKEND}"
    f.cache = _core.AttentionCache.paged
    other = []
    if int(layer.v_head_dim) != f.head_dim:
        other.append(f"value heads of {layer.v_head_dim} against q/k heads of {f.head_dim}")
    if getattr(layer, "is_cross_attention", False):
        other.append("cross attention (encoder positions)")
    kind = getattr(getattr(layer, "attn_type", None), "value", "decoder")
    if kind != "decoder":
        other.append(f"attention type {kind!r}")
    window = getattr(layer, "sliding_window_size", -1)
    if window is not None and window > -1:
        other.append(f"a sliding window of {window}")
    if getattr(layer, "logit_cap", 0.0) and layer.logit_cap > 0:
        # The torch-native backend does not apply it; seating it either way would differ from
        # what the layer declares or from what SGLang computes.
        other.append(f"a logit cap of {layer.logit_cap} (the torch-native backend ignores it)")
    if getattr(layer, "use_irope", False):
        other.append("chunked attention (irope)")
    f.form = _core.AttentionForm.other if other else _core.AttentionForm.softmax
    f.other = "; ".join(other)
    return f


def host_call(path: str, layer: Any, dtype: torch.dtype) -> _core.HostCall:
    """The call the seat stands in: one query token per row, in the engine's dtype."""
    from ..observe import dtype_of
    c = _core.HostCall()
    c.path, c.rows = path, 1
    c.width = int(layer.tp_q_head_num) * int(layer.qk_head_dim)
    c.dtype = dtype_of(dtype)
    return c


def _backend_class() -> Any:
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    return TorchNativeAttnBackend


def _route() -> None:
    """The backend's decode and extend methods, wrapped once: a layer with a seat goes to it."""
    if _ORIGINALS:
        return
    cls = _backend_class()
    decode, extend = cls.forward_decode, cls.forward_extend

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        seat = _SEATS.get(layer)
        if seat is None:
            return decode(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        if kwargs:  # arguments the op does not compute (a sink, a scale of SGLang's): counted
            args = (self, q, k, v, layer, forward_batch, save_kv_cache)
            why = "the backend was called with " + ", ".join(sorted(kwargs))
            return seat._host_call(seat._seat.miss(why), decode, args, kwargs)
        return seat.decode(decode, self, q, k, v, layer, forward_batch, save_kv_cache)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        seat = _SEATS.get(layer)
        if seat is not None:
            seat.count_extend()
        return extend(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)

    _ORIGINALS.update(forward_decode=decode, forward_extend=extend)
    cls.forward_decode, cls.forward_extend = forward_decode, forward_extend


def _unroute() -> None:
    """With the last seat gone, the backend's own methods are back (the very objects)."""
    if _SEATS or not _ORIGINALS:
        return
    cls = _backend_class()
    for name, fn in _ORIGINALS.items():
        setattr(cls, name, fn)
    _ORIGINALS.clear()


def _write_loc(backend: Any, forward_batch: Any) -> Any:
    """Where the backend writes the step's keys and values, as it names it."""
    try:
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc
    except ImportError:  # an SGLang that writes by the location alone
        return forward_batch.out_cache_loc
    return KVWriteLoc(forward_batch.out_cache_loc, getattr(backend, "swa_out_cache_loc", None))


def _int64(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int64 and t.is_contiguous() else t.to(torch.int64).contiguous()


class PagedAttentionSeat(FunctionSeat):
    """One RadixAttention layer's decode batches, placed in the torch-native backend."""

    def __init__(self, site: str, host: nn.Module, seat: _core.Seat) -> None:
        super().__init__(site, host, seat, [])

    def place(self) -> None:
        _SEATS[self.host] = self
        _route()

    def undo(self) -> None:
        if _SEATS.get(self.host) is self:
            del _SEATS[self.host]
        _unroute()

    def claims(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        return False  # not a namespace function: the backend's routed methods call decode()

    def count_extend(self) -> None:
        """An extend (prefill) batch is SGLang's extend path's, whatever its length: a band
        dispatch (the seat serves decode batches)."""
        self._seat.count_band()

    def decode(self, original: Callable[..., Any], backend: Any, q: torch.Tensor,
               k: torch.Tensor | None, v: torch.Tensor | None, layer: Any,
               forward_batch: Any, save_kv_cache: bool) -> torch.Tensor:
        args = (backend, q, k, v, layer, forward_batch, save_kv_cache)
        seat = cast(_core.AttentionSeat, self._seat)
        if torch.compiler.is_compiling():  # traced: SGLang's own (docs/doors/sglang.md)
            return original(*args)
        why = ""
        if getattr(forward_batch, "encoder_lens", None) is not None:
            why = "the batch carries encoder positions"
        elif getattr(backend, "use_sliding_window_kv_pool", False):
            why = "the engine's pool keeps sliding-window layers apart"
        elif torch.is_grad_enabled() and q.requires_grad:
            why = "q requires grad (autograd)"
        if why:
            return self._host_call(seat.miss(why), original, args, {})
        heads, dim = int(layer.tp_q_head_num), int(layer.qk_head_dim)
        pool = backend.token_to_kv_pool
        # The step's keys and values go into the pool as the backend writes them; from here on
        # the backend's own decode (a miss below) is called without writing them again.
        if save_kv_cache and k is not None and v is not None:
            pool.set_kv_buffer(layer, _write_loc(backend, forward_batch), k, v)
        rows_q = q.reshape(-1, heads, dim)
        q32 = rows_q.float() if rows_q.dtype != torch.float32 else rows_q
        out = torch.empty((rows_q.shape[0], heads, dim), dtype=torch.float32)
        verdict = seat.call_paged(
            q32, pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id),
            backend.req_to_token_pool.req_to_token, _int64(forward_batch.req_pool_indices),
            _int64(forward_batch.seq_lens), out, float(layer.scaling), 0.0, False)
        if verdict != RAN:
            return self._host_call(verdict, original, args[:-1] + (False,), {})
        return out.to(q.dtype).reshape(rows_q.shape[0], heads * dim)

"""decode_loop: the whole decode step of a Llama-family decoder run in the core (DESIGN §8).

The stack is found through the Llama-family binding (the slot names this family uses: the
decoder's `layers`, each with `self_attn.{q,k,v,o}_proj`, optional per-head `q_norm`/`k_norm`,
`input_layernorm`, `post_attention_layernorm`, `mlp.{gate,up,down}_proj` and `mlp.act_fn`, then
the final `norm` and the output embedding). What each piece computes is checked, not assumed:
norms are probed against x·w/rms(x), the activation is measured, the rotary frequencies are the
host's own, and the built loop is self-checked against the host on a probe before it is handed
out. Anything outside that is refused with the form named, and the host is left untouched.

Weights are borrowed from the host (no copy) or taken from seated impls: whatever is attached
when decode_loop() is called is what the loop runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from . import _core
from .observe import measure_activation
from .seats import FfnSeatModule, LinearSeatModule

Refused = _core.Refused
SUPPORTED_ROPE = ("default", "linear", "llama3")
SELF_CHECK_TOKENS = 8
SELF_CHECK_AGREEMENT = 0.75


def _refuse(why: str) -> None:
    raise Refused(f"decode_loop: {why}")


def _rope_type(config: Any) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not params:
        return "default"
    return params.get("rope_type", params.get("type", "default"))


def _slot(module: nn.Module, path: str, where: str) -> Any:
    obj = module
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            _refuse(f"a required slot is absent on this host: {where}.{path}")
    return obj


def _norm_weight(norm: nn.Module, width: int, where: str) -> tuple[torch.Tensor, float]:
    """The weight of an x·w/rms(x) norm, after checking the module computes exactly that."""
    w = getattr(norm, "weight", None)
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if not isinstance(w, torch.Tensor) or w.shape != (width,) or eps is None:
        _refuse(f"{where} is not an RMSNorm over {width} features with a weight and an epsilon")
    probe = torch.randn(2, width, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = probe * torch.rsqrt(probe.pow(2).mean(-1, keepdim=True) + eps) * w
        got = norm(probe)
    if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
        _refuse(f"{where} does not compute x·w/rms(x) (a different norm form, e.g. x·(1+w))")
    return w.detach(), float(eps)


def _proj(module: nn.Module) -> tuple[Any, Any]:
    """(weight tensor or the seat's core object, bias) for one projection."""
    if isinstance(module, LinearSeatModule):
        return module.seat, None
    if not isinstance(module, nn.Linear):
        _refuse(f"projection {type(module).__name__} is neither a linear nor a flashrt seat")
    return module.weight.detach(), None if module.bias is None else module.bias.detach()


@dataclass
class DecodeLoop:
    """A built decode loop. generate() prefills and decodes in the core; generate_from() lets
    the host prefill and decodes from its cache. Batch 1, greedy."""

    model: nn.Module
    program: Any
    max_len: int
    seated: int
    _keep: list[Any] = field(default_factory=list, repr=False)  # borrowed tensors and seats
    timing: dict[str, float] = field(default_factory=dict)

    def _check(self, input_ids: torch.Tensor, new: int) -> list[int]:
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            _refuse(f"input_ids {tuple(input_ids.shape)}: the loop runs batch 1 ([1, prompt])")
        if new < 1 or input_ids.shape[1] < 1:
            raise ValueError("decode_loop: need a non-empty prompt and max_new_tokens >= 1")
        if input_ids.shape[1] + new > self.max_len:
            raise ValueError(f"decode_loop: prompt {input_ids.shape[1]} + {new} new tokens exceed "
                             f"the static window of {self.max_len}")
        return input_ids[0].tolist()

    def _decode(self, tokens: list[int], first: int, new: int) -> torch.Tensor:
        out = tokens + [first]
        t0 = time.perf_counter()
        for i in range(new - 1):
            out.append(self.program.step(out[-1], len(out) - 1))
        self.timing["decode_s"] = time.perf_counter() - t0
        self.timing["decode_steps"] = new - 1
        return torch.tensor([out], dtype=torch.long)

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Prefill (token by token, in the core) then greedy decode; [1, prompt + new]."""
        tokens = self._check(input_ids, max_new_tokens)
        t0 = time.perf_counter()
        nxt = 0
        for pos, tok in enumerate(tokens):
            nxt = self.program.step(tok, pos)
        self.timing = {"prefill_s": time.perf_counter() - t0, "prefill_tokens": len(tokens)}
        return self._decode(tokens, nxt, max_new_tokens)

    def generate_from(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """The host prefills (its own forward, its cache); the loop imports the cache and
        decodes. [1, prompt + new]."""
        tokens = self._check(input_ids, max_new_tokens)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model(input_ids, use_cache=True)
        cache = out.past_key_values
        layers = getattr(cache, "layers", None)
        if layers is None:
            _refuse(f"host cache {type(cache).__name__} has no per-layer keys/values to import")
        for i, layer in enumerate(layers):
            k = layer.keys[0].transpose(0, 1).contiguous()  # [positions, kv_heads, head_dim]
            v = layer.values[0].transpose(0, 1).contiguous()
            self.program.load_cache(i, k, v)
        first = int(out.logits[0, -1].argmax())
        self.timing = {"prefill_s": time.perf_counter() - t0, "prefill_tokens": len(tokens)}
        return self._decode(tokens, first, max_new_tokens)

    def teacher_forced(self, ids: torch.Tensor) -> list[int]:
        """The loop's argmax after each prefix of ids (fed the given tokens, not its own)."""
        tokens = self._check(ids, 1)
        return [self.program.step(tok, pos) for pos, tok in enumerate(tokens)]

    @property
    def weight_bytes(self) -> int:
        return self.program.weight_bytes


def decode_loop(model: nn.Module, max_len: int) -> DecodeLoop:
    """Builds the loop over `model` as it stands (host weights, or seated impls where attached).
    Raises Refused naming what it cannot cover; the host is never modified."""
    if max_len < SELF_CHECK_TOKENS:
        raise ValueError(f"decode_loop: max_len {max_len} < {SELF_CHECK_TOKENS}")
    cfg = model.config
    inner = _slot(model, "model", "host")
    layers = _slot(inner, "layers", "model")
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    final_norm = _slot(inner, "norm", "model")
    if embed is None or head is None:
        _refuse("a required slot is absent on this host: input or output embedding")
    if embed.weight.dtype != torch.float32:
        _refuse(f"host dtype {embed.weight.dtype}: the loop computes in fp32 and would not "
                "reproduce the host's arithmetic")
    window = getattr(cfg, "sliding_window", None)
    sliding = getattr(cfg, "use_sliding_window", False) or "sliding_attention" in (
        getattr(cfg, "layer_types", None) or [])
    if window and sliding:
        _refuse(f"sliding-window attention (window {window}); the loop attends over the whole "
                "static window")
    rope = _rope_type(cfg)
    if rope not in SUPPORTED_ROPE:
        _refuse(f"rotary form '{rope}' (supported: {', '.join(SUPPORTED_ROPE)})")
    rotary = _slot(inner, "rotary_emb", "model")
    inv_freq = getattr(rotary, "inv_freq", None)
    if not isinstance(inv_freq, torch.Tensor):
        _refuse("the host's rotary module exposes no inv_freq")

    hidden = embed.weight.shape[1]
    heads, kv_heads = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    keep: list[Any] = []
    specs = []
    seated = 0
    qk_norm = None
    eps = None
    for i, layer in enumerate(layers):
        where = f"model.layers.{i}"
        attn = _slot(layer, "self_attn", where)
        if hasattr(attn, "qkv_proj") or hasattr(attn, "c_attn"):
            _refuse(f"{where}.self_attn has a fused qkv projection; the loop cannot split it")
        spec: dict[str, Any] = {}
        spec["input_norm"], eps = _norm_weight(_slot(layer, "input_layernorm", where), hidden,
                                               f"{where}.input_layernorm")
        spec["post_norm"], _ = _norm_weight(_slot(layer, "post_attention_layernorm", where),
                                            hidden, f"{where}.post_attention_layernorm")
        has_qk = hasattr(attn, "q_norm") and hasattr(attn, "k_norm")
        qk_norm = has_qk if qk_norm is None else qk_norm
        if has_qk:
            spec["q_norm"], _ = _norm_weight(attn.q_norm, head_dim, f"{where}.self_attn.q_norm")
            spec["k_norm"], _ = _norm_weight(attn.k_norm, head_dim, f"{where}.self_attn.k_norm")
        for name in ("q", "k", "v", "o"):
            module = _slot(attn, f"{name}_proj", f"{where}.self_attn")
            spec[name], spec[f"{name}_bias"] = _proj(module)
            seated += isinstance(module, LinearSeatModule)
        mlp = _slot(layer, "mlp", where)
        if isinstance(mlp, FfnSeatModule):
            spec["ffn"] = mlp.seat
            seated += 1
        else:
            for name in ("gate", "up", "down"):
                module = _slot(mlp, f"{name}_proj", f"{where}.mlp")
                spec[name], bias = _proj(module)
                seated += isinstance(module, LinearSeatModule)
                if bias is not None:
                    _refuse(f"{where}.mlp.{name}_proj has a bias; the loop's FFN is bias-free")
            act = measure_activation(_slot(mlp, "act_fn", f"{where}.mlp"))
            if act not in ("silu", "gelu_tanh"):
                _refuse(f"{where}.mlp activation '{act}' outside {{silu, gelu_tanh}}")
            spec["act"] = act
        specs.append(spec)
        keep.append(spec)
    final_w, _ = _norm_weight(final_norm, hidden, "model.norm")
    head_w, head_bias = _proj(head)
    if head_bias is not None:
        _refuse("the output head has a bias")
    seated += isinstance(head, LinearSeatModule)

    c = _core.DecodeConfig()
    c.layers, c.hidden, c.heads, c.kv_heads, c.head_dim = (len(specs), hidden, heads, kv_heads,
                                                          head_dim)
    c.intermediate = getattr(cfg, "intermediate_size", 0)
    c.vocab, c.max_len, c.eps, c.qk_norm = head.out_features, max_len, eps, bool(qk_norm)
    c.inv_freq = inv_freq.detach().float().tolist()
    c.attention_scaling = float(getattr(rotary, "attention_scaling", 1.0))
    embed_w = embed.weight.detach()
    program = _core.make_decode_program(c, embed_w, final_w, head_w, specs)
    loop = DecodeLoop(model, program, max_len, seated, [embed_w, final_w, head_w, *keep])
    _self_check(loop, c.vocab)
    return loop


def _self_check(loop: DecodeLoop, vocab: int) -> None:
    """Teacher-forced agreement with the host on a probe: the declaration that the loop computes
    this host is checked before anyone relies on it."""
    probe = torch.randint(0, vocab, (1, SELF_CHECK_TOKENS), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        host = loop.model(probe).logits[0].argmax(-1).tolist()
    mine = loop.teacher_forced(probe)
    agree = sum(a == b for a, b in zip(mine, host)) / len(host)
    if agree < SELF_CHECK_AGREEMENT:
        _refuse(f"self-check against the host: teacher-forced agreement {agree:.2f} on a "
                f"{SELF_CHECK_TOKENS}-token probe (< {SELF_CHECK_AGREEMENT}); this stack computes "
                "something the loop does not")

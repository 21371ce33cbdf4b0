"""decode_loop: the whole decode step of a decoder run in the core (DESIGN §8): Llama-family
stacks (with Granite's multipliers and SmolLM3's rotary-free layers), Gemma 2 and 3, OLMo 2 and
Phi-3, their feed-forwards dense or routed (a bank of experts, its router measured on a call of
its own).

The door observes the module tree (norm forms, activations, rotary frequencies and the
embedding's scale measured, not read from class names; the host's declared head counts, rotary
form, layer types and scalars) into a HostGraph; the core chooses the binding that describes the
host (catalog/bindings/*.yaml: where a family keeps each slot), plans the program against it and
refuses, with the form named, what it cannot cover. The door then hands the core
the tensor (or seat) of each planned slot, and the built loop is self-checked against the host on
a probe before it is handed out. The host is never modified.

Weights are borrowed from the host (no copy) or taken from seated impls: whatever is attached
when decode_loop() is called is what the loop runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn

from . import _core, catalog, swap
from . import receipt as receipts
from .observe import describe_tree
from .observe.experts import describe_bank
from .observe.routing import describe_routing
from .seats import PackLead, PackMember, SeatModule

Refused = _core.Refused


def _refuse(why: str) -> NoReturn:
    raise Refused(f"decode_loop: {why}")


# A callable receiving each new token id, or a transformers streamer (put(tensor)/end()).
Streamer = Callable[[int], Any] | Any | None


def _prompt(streamer: Streamer, input_ids: torch.Tensor) -> None:
    """A transformers streamer is handed the prompt first, as generate() does (it skips it
    when asked to)."""
    if streamer is not None and hasattr(streamer, "put"):
        streamer.put(input_ids.cpu())


def _emit(streamer: Streamer, token: int) -> None:
    if streamer is None:
        return
    if hasattr(streamer, "put"):
        streamer.put(torch.tensor([token]))
    else:
        streamer(token)


@dataclass
class DecodeLoop:
    """A built decode loop. generate() prefills and decodes in the core: one sequence, or a batch
    of up to the sequences it was built for (decode_loop(..., batch=B)), every decode step
    reading each weight once for all of them; generate_from() lets the host prefill one sequence
    and decodes from its cache. Greedy."""

    model: nn.Module
    program: Any
    max_len: int
    seated: int
    _keep: list[Any] = field(default_factory=list, repr=False)  # borrowed tensors and seats
    timing: dict[str, float] = field(default_factory=dict)
    plan: Any = field(default=None, repr=False)  # the core's DecodePlan (explain() prints it)
    # What the self-check against the host measured before the loop was handed out (receipts).
    self_check: dict[str, Any] = field(default_factory=dict)

    def receipt(self) -> dict[str, Any]:
        """The decode plan, the self-check's figures, the last run's timings, the ledger of the
        seats attached on the host, and the environment lock (docs/receipts.md)."""
        return receipts.of_decode(self, swap._active(self.model))

    def save_receipt(self, directory: str | Path) -> Path:
        """Writes receipt() to `directory`/receipt.json (the folder is created); its path."""
        return receipts.save(self.receipt(), directory)

    def _check(self, input_ids: torch.Tensor, new: int) -> list[int]:
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            _refuse(f"input_ids {tuple(input_ids.shape)}: one sequence ([1, prompt]) here; a "
                    "batch goes through generate()")
        if new < 1 or input_ids.shape[1] < 1:
            raise ValueError("decode_loop: need a non-empty prompt and max_new_tokens >= 1")
        if input_ids.shape[1] + new > self.max_len:
            raise ValueError(f"decode_loop: prompt {input_ids.shape[1]} + {new} new tokens exceed "
                             f"the static window of {self.max_len}")
        return input_ids[0].tolist()

    def _eos(self, eos_token_id: int | list[int] | None) -> list[int]:
        """The stop tokens in the order given: the argument, else the host's generation config
        (one or several)."""
        if eos_token_id is None:
            config = getattr(self.model, "generation_config", None)
            eos_token_id = getattr(config, "eos_token_id", None)
        if eos_token_id is None:
            return []
        ids = eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
        return list(dict.fromkeys(int(t) for t in ids))

    def _decode(self, tokens: list[int], first: int, new: int, eos: list[int],
                streamer: Streamer) -> torch.Tensor:
        """Greedy decode from `first` until max_new_tokens or a stop token (kept, as generate
        keeps it); each new token goes to the streamer as it comes."""
        out = tokens + [first]
        _emit(streamer, first)
        t0 = time.perf_counter()
        steps = 0
        while len(out) - len(tokens) < new and out[-1] not in eos:
            out.append(self.program.step(out[-1], len(out) - 1))
            steps += 1
            _emit(streamer, out[-1])
        if streamer is not None and hasattr(streamer, "end"):
            streamer.end()
        self.timing["decode_s"] = time.perf_counter() - t0
        self.timing["decode_steps"] = steps
        return torch.tensor([out], dtype=torch.long)

    def generate(self, input_ids: torch.Tensor | list[Any], max_new_tokens: int, *,
                 attention_mask: torch.Tensor | None = None,
                 eos_token_id: int | list[int] | None = None,
                 streamer: Streamer = None) -> Any:
        """Prefill (in the core, blocks of up to 256 rows) then greedy decode, like the host's
        greedy generate: stops after max_new_tokens or at a stop token (eos_token_id, default the
        generation config's). streamer: a callable taking each new token id, or a transformers
        streamer (put/end). Returns [1, prompt + new].

        A batch: input_ids [B, T] with attention_mask (1 on each sequence's tokens, padding on
        either side; without a mask every token of a row is its prompt, pads included), or a
        list of B prompts of any lengths; each sequence has its own KV window,
        length and stop. Returns [B, T + new] (each row as given, then its new tokens, padded
        after its stop with the generation config's pad id) for a tensor, a list of
        [prompt + new] tensors for a list."""
        if isinstance(input_ids, (list, tuple)) and attention_mask is not None:
            raise ValueError("decode_loop: a list of prompts takes no attention_mask (each "
                             "prompt is its own tokens)")
        if not isinstance(input_ids, (list, tuple)):
            _integer_ids(input_ids)
        if isinstance(input_ids, (list, tuple)) or input_ids.shape[0] > 1:
            return self._generate_batch(input_ids, max_new_tokens, attention_mask,
                                        self._eos(eos_token_id), streamer)
        if attention_mask is not None:
            # One sequence with its mask (a tokenizer's output): its own tokens run, the row is
            # returned as given with the new tokens after it.
            kept = _batch_prompts(input_ids, attention_mask)[0]
            out = self.generate(torch.tensor([kept], dtype=torch.long), max_new_tokens,
                                eos_token_id=eos_token_id, streamer=streamer)
            return torch.cat([input_ids.long(), out[:, len(kept):]], dim=1)
        tokens = self._check(input_ids, max_new_tokens)
        eos = self._eos(eos_token_id)
        _prompt(streamer, input_ids)
        t0 = time.perf_counter()
        nxt = self.program.prefill(tokens, 0)  # blocks of up to 256 rows, causal inside
        self.timing = {"prefill_s": time.perf_counter() - t0, "prefill_tokens": len(tokens)}
        return self._decode(tokens, nxt, max_new_tokens, eos, streamer)

    def _generate_batch(self, input_ids: torch.Tensor | list[Any], new: int,
                        mask: torch.Tensor | None, eos: list[int], streamer: Streamer) -> Any:
        """Each sequence prefilled on its own window, then batch steps over the live ones."""
        if streamer is not None:
            raise ValueError("decode_loop: a streamer takes one sequence; a batch returns them")
        prompts = _batch_prompts(input_ids, mask)
        if not prompts:
            raise ValueError("decode_loop: an empty batch")
        batch = self.program.config.sequences
        if len(prompts) > batch:
            _refuse(f"a batch of {len(prompts)} sequences; this loop holds {batch} "
                    + (f"(decode_loop(model, max_len, batch={len(prompts)}))"
                       if len(prompts) <= _MAX_BATCH else
                       f"and a loop holds at most {_MAX_BATCH}"))
        if new < 1 or any(len(p) == 0 for p in prompts):
            raise ValueError("decode_loop: need non-empty prompts and max_new_tokens >= 1")
        longest = max(len(p) for p in prompts)
        if longest + new > self.max_len:
            raise ValueError(f"decode_loop: prompt {longest} + {new} new tokens exceed the "
                             f"static window of {self.max_len}")
        t0 = time.perf_counter()
        outs = [p + [self.program.prefill(p, 0, b)] for b, p in enumerate(prompts)]
        self.timing = {"prefill_s": time.perf_counter() - t0,
                       "prefill_tokens": sum(len(p) for p in prompts)}
        t0 = time.perf_counter()
        steps = tokens = 0
        while True:
            live = [b for b, out in enumerate(outs)
                    if len(out) - len(prompts[b]) < new and out[-1] not in eos]
            if not live:
                break
            nxt = self.program.step_batch([outs[b][-1] for b in live], live,
                                          [len(outs[b]) - 1 for b in live])
            for b, token in zip(live, nxt, strict=True):
                outs[b].append(token)
            steps += 1
            tokens += len(live)
        self.timing.update(decode_s=time.perf_counter() - t0, decode_steps=steps,
                           decode_tokens=tokens)
        if isinstance(input_ids, (list, tuple)):
            return [torch.tensor(out, dtype=torch.long) for out in outs]
        pad = getattr(getattr(self.model, "generation_config", None), "pad_token_id", None)
        pad = pad if pad is not None else (eos[0] if eos else 0)  # as generate pads
        width = max(len(out) - len(p) for out, p in zip(outs, prompts, strict=True))
        rows = [input_ids[b].tolist() + out[len(prompts[b]):] for b, out in enumerate(outs)]
        return torch.tensor([r + [pad] * (input_ids.shape[1] + width - len(r)) for r in rows],
                            dtype=torch.long)

    def generate_from(self, input_ids: torch.Tensor, max_new_tokens: int, *,
                      eos_token_id: int | list[int] | None = None,
                      streamer: Streamer = None) -> torch.Tensor:
        """The host prefills (its own forward, its cache); the loop imports the cache and
        decodes, stopping as generate() does. [1, prompt + new]."""
        tokens = self._check(input_ids, max_new_tokens)
        eos = self._eos(eos_token_id)
        _prompt(streamer, input_ids)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model(input_ids, use_cache=True)
        cache = _host_cache(out)
        layers = getattr(cache, "layers", None)
        if layers is None:
            _refuse(f"host cache {type(cache).__name__} has no per-layer keys/values to import")
        for i, layer in enumerate(layers):
            k = layer.keys[0].transpose(0, 1).contiguous()  # [positions, kv_heads, head_dim]
            v = layer.values[0].transpose(0, 1).contiguous()
            # A sliding layer's cache holds the prompt's last positions only (its window).
            self.program.load_cache(i, k, v, len(tokens) - k.shape[0])
        first = int(out.logits[0, -1].argmax())
        self.timing = {"prefill_s": time.perf_counter() - t0, "prefill_tokens": len(tokens)}
        return self._decode(tokens, first, max_new_tokens, eos, streamer)

    def teacher_forced(self, ids: torch.Tensor) -> list[int]:
        """The loop's argmax after each prefix of ids (fed the given tokens, not its own)."""
        tokens = self._check(ids, 1)
        return [self.program.step(tok, pos) for pos, tok in enumerate(tokens)]

    def teacher_forced_logits(self, ids: torch.Tensor) -> list[Any]:
        """The loop's logits after each prefix of ids (fed the given tokens), one array each."""
        tokens = self._check(ids, 1)
        out = []
        for pos, tok in enumerate(tokens):
            self.program.step(tok, pos)
            out.append(self.program.logits().copy())
        return out

    def score(self, ids: torch.Tensor | list[Any]) -> Any:
        """Teacher-forced through the loop: for each position t < len-1, the negative log-
        likelihood of ids[t+1] and the loop's argmax (perplexity = exp(mean nll)). A list of
        sequences: one (nll, argmax) pair per sequence."""
        if isinstance(ids, (list, tuple)):
            return [self.score(torch.as_tensor(s, dtype=torch.long).reshape(1, -1)) for s in ids]
        tokens = self._check(ids, 1)
        nll, top = [], []
        for pos, tok in enumerate(tokens[:-1]):
            top.append(self.program.step(tok, pos))
            logits = torch.from_numpy(self.program.logits()).double()
            nll.append(float(torch.logsumexp(logits, 0) - logits[tokens[pos + 1]]))
        return nll, top

    @property
    def weight_bytes(self) -> int:
        return self.program.weight_bytes


_MAX_BATCH = 16  # the kernels' row band: a batch step is one block of rows


def _integer_ids(ids: torch.Tensor) -> None:
    """Token ids are integers with at least one dimension; anything else is a clear error."""
    if ids.dim() == 0 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"decode_loop: token ids {ids.dtype}{tuple(ids.shape)}: expected an "
                         "integer tensor [T] or [B, T]")


def _batch_prompts(input_ids: torch.Tensor | list[Any], mask: torch.Tensor | None
                   ) -> list[list[int]]:
    """Each sequence's own tokens: a list's prompts, or each row of [B, T] where its mask is 1."""
    if isinstance(input_ids, (list, tuple)):
        prompts = []
        for p in input_ids:
            t = torch.as_tensor(p)
            _integer_ids(t)
            if t.dim() > 1 and t.shape[0] != 1:
                raise ValueError(f"decode_loop: a prompt of shape {tuple(t.shape)} in the list; "
                                 "each is one sequence ([T] or [1, T])")
            prompts.append(t.reshape(-1).tolist())
        return prompts
    if input_ids.dim() != 2:
        raise ValueError(f"decode_loop: input_ids {tuple(input_ids.shape)}: expected [B, T]")
    if mask is None:
        return input_ids.tolist()
    if mask.shape != input_ids.shape:
        raise ValueError(f"decode_loop: attention_mask {tuple(mask.shape)} is not input_ids' "
                         f"{tuple(input_ids.shape)}")
    prompts = []
    for row, keep in zip(input_ids, mask.bool(), strict=True):
        idx = keep.nonzero().flatten()
        if len(idx) and int(idx[-1] - idx[0]) + 1 != len(idx):
            raise ValueError("decode_loop: attention_mask with a gap inside a sequence")
        prompts.append(row[keep].tolist())
    return prompts


def plan_decode(model: nn.Module, max_len: int, binding: str = "",
                batch: int = 1, kv_cache: str = "f32") -> _core.DecodePlan:
    """The core's decode plan for `model` (print it with explain()); builds nothing. Without a
    binding the core chooses the one that describes the host; `batch`: the sequences it holds
    a KV window for; `kv_cache`: that window's dtype, "f32" (the host's values) or "bf16" (half
    the bytes attention reads; Note [KV cache dtype] in core/src/decode/program.cpp)."""
    graph, _ = describe_tree(model)
    describe_routing(model, graph)  # banks' and routers' forms, measured on calls of their own
    return _core.plan_decode(graph, catalog.shipped(), binding, max_len, batch, kv_cache)


def _standing(model: nn.Module, path: str) -> tuple[Any, Any]:
    """What stands at a module the plan names: (a seat's core object, None), the host's own
    (weight, bias) (also under a packed seat's module, whose core seat computes several
    projections), a bank's (gate, up, down) [experts, out, in] tensors (a fused gate_up's two
    halves, views), or (None, None) for a module with no weight (a rotary, an activation)."""
    module = model.get_submodule(path)
    if isinstance(module, (PackLead, PackMember)) or (
            isinstance(module, SeatModule) and module.seat.form.op == _core.OpKind.rmsnorm):
        module = module.host  # a norm's seat: the host's weight and epsilon are the program's
    if isinstance(module, SeatModule):
        return module.seat, None
    bank = describe_bank(module)
    if bank is not None:
        tensor = lambda name: getattr(module, name).detach()  # noqa: E731
        if bank.gate_up:
            gate, up = tensor(bank.gate_up).chunk(2, dim=1)
        else:
            gate, up = tensor(bank.gate), tensor(bank.up)
        return (gate, up, tensor(bank.down)), None
    weight = getattr(module, "weight", None)
    bias = getattr(module, "bias", None)
    return (weight.detach() if isinstance(weight, torch.Tensor) else None,
            bias.detach() if isinstance(bias, torch.Tensor) else None)


def decode_loop(model: nn.Module, max_len: int, batch: int = 1,
                kv_cache: str = "f32") -> DecodeLoop:
    """Builds the loop over `model` as it stands (host weights, or seated impls where attached),
    holding a KV window of max_len for each of `batch` sequences (1..16), its elements f32 (the
    host's values) or, with kv_cache="bf16", rounded to bf16 as they are written. Raises Refused
    naming what it cannot cover; the host is never modified."""
    probe = catalog.shipped().decode_self_check.probe_tokens
    if max_len < probe:
        raise ValueError(f"decode_loop: max_len {max_len} < {probe} (the self-check's probe)")
    plan = plan_decode(model, max_len, batch=batch, kv_cache=kv_cache)
    if not plan.ok:
        _refuse(plan.refused[0][1])
    tensors = _core.DecodeTensors(plan)  # Note [Decode tensors] in bind_decode.cpp
    for path in tensors.paths():
        tensors.put(path, *_standing(model, path))
    program = _core.make_decode_program(tensors)
    loop = DecodeLoop(model, program, max_len, plan.seated, [tensors], plan=plan)
    _self_check(loop, plan.config.vocab)
    return loop


def _host_cache(out: Any) -> Any:
    """The cache a host's forward returned (`cache` in transformers >= 5.20, before that
    `past_key_values`, which now warns when read)."""
    return out.get("cache", None) if "cache" in out else out.get("past_key_values", None)


def _host_keys(out: Any) -> list[torch.Tensor]:
    """The keys the host cached on a forward, per layer [positions, kv_heads, head_dim] (a
    sliding layer's: its window's last positions)."""
    cache = _host_cache(out)
    layers = getattr(cache, "layers", None)
    if not layers:
        _refuse(f"the host's forward returned no per-layer key cache to check against "
                f"({type(cache).__name__})")
    return [layer.keys[0].transpose(0, 1).float() for layer in layers]


def _self_check(loop: DecodeLoop, vocab: int) -> None:
    """Teacher-forced against the host on a probe of random tokens, the loop's logits and the
    host's at every position, and the keys each layer cached (after rotary): the declaration that
    the loop computes this host is checked before anyone relies on it. The core judges
    (gates.yaml self_checks.decode_loop)."""
    spec = catalog.shipped().decode_self_check
    n = spec.probe_tokens
    probe = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = loop.model(probe, use_cache=True)
    host = out.logits[0].float().contiguous()
    host_keys = _host_keys(out)
    mine = torch.stack([torch.from_numpy(row) for row in loop.teacher_forced_logits(probe)])
    if len(host_keys) != loop.program.config.layers:
        _refuse(f"the host cached {len(host_keys)} layers of keys; the loop runs "
                f"{loop.program.config.layers}")
    # The positions every layer's host cache kept: all n, or the last of a sliding window's.
    kept = min(k.shape[0] for k in host_keys)
    mine_keys = torch.cat([
        torch.from_numpy(loop.program.read_cache(i, n)[0])[n - kept:].reshape(kept, -1)
        for i in range(len(host_keys))])
    want_keys = torch.cat([k[k.shape[0] - kept:].reshape(kept, -1) for k in host_keys])
    want_keys = want_keys.contiguous()
    if mine_keys.shape != want_keys.shape:
        _refuse(f"the host's cached keys {tuple(want_keys.shape)} are not the loop's "
                f"{tuple(mine_keys.shape)}")
    verdict = _core.judge_self_check(spec, mine, host, mine_keys, want_keys, n - kept)
    loop.self_check = {"tokens": verdict.positions, "agreement": verdict.top1_agreement,
                       "threshold": spec.top1_agreement, "min_cosine": verdict.min_cosine,
                       "cosine_floor": spec.logits_cosine,
                       "min_keys_cosine": verdict.min_keys_cosine,
                       "keys_cosine_floor": spec.keys_cosine, "verdict": verdict.text}
    if not verdict.passed:
        _refuse(verdict.text)

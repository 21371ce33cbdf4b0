"""Writes a Qwen3-shaped, Qwen3-MoE-shaped, Granite or Gemma 3 transformers model as a GGUF file
llama.cpp loads (for the decode and MoE benchmarks' llama.cpp peer), with the `gguf` package: the
same weights,
quantized to Q8_0 or Q4_0 by gguf's own quantizers (norms and routers stay F32; the
embedding/head stays Q8_0 in both, as the w4a16 schemes keep their head at int8). A bank of
routed experts is written as llama.cpp's converter writes it: ffn_gate_exps and ffn_up_exps
[experts, F, D] (the halves of the host's fused gate_up_proj), ffn_down_exps [experts, D, F].

The random-weight hosts have no tokenizer, so the file carries a placeholder vocabulary (one
token per id, one placeholder merge): the benchmark feeds token ids and never text.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch


def _tensor(writer: gguf.GGUFWriter, name: str, t: torch.Tensor, qtype) -> None:
    data = t.detach().float().contiguous().numpy()
    if qtype == gguf.GGMLQuantizationType.F32 or data.ndim == 1:
        writer.add_tensor(name, data.astype(np.float32))
        return
    writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


def _header(w: gguf.GGUFWriter, cfg, weights: str) -> None:
    """Hyperparameters, file type and a placeholder vocabulary (one token per id)."""
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    params = getattr(cfg, "rope_parameters", None) or {}
    params = params.get("full_attention", params)  # one per layer type: the global layers'
    w.add_rope_freq_base(float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type({"Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "F16": gguf.LlamaFileType.MOSTLY_F16}
                    .get(weights, gguf.LlamaFileType.MOSTLY_Q4_0))
    vocab = cfg.vocab_size
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([f"<t{i}>" for i in range(vocab)])
    w.add_token_types([gguf.TokenType.NORMAL] * vocab)
    w.add_token_merges(["<t0> <t1>"])  # llama.cpp requires the key; an empty array is not written
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)


def _stack_ends(w: gguf.GGUFWriter, model, final_norm: torch.Tensor,
                ends=gguf.GGMLQuantizationType.Q8_0) -> None:
    """The embedding (Q8_0, or F16 in an F16 file), the final norm's weight as the architecture
    stores it, and the head (the same) unless it is the embedding."""
    _tensor(w, "token_embd.weight", model.model.embed_tokens.weight, ends)
    _tensor(w, "output_norm.weight", final_norm, gguf.GGMLQuantizationType.F32)
    if not model.config.tie_word_embeddings:
        _tensor(w, "output.weight", model.lm_head.weight, ends)


def _common_tensors(w: gguf.GGUFWriter, model, qtype) -> None:
    """Embedding, final norm, head, and each layer's norms and attention."""
    f32 = gguf.GGMLQuantizationType.F32
    inner = model.model
    f16, q8 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.Q8_0
    _stack_ends(w, model, inner.norm.weight, f16 if qtype == f16 else q8)
    for i, layer in enumerate(inner.layers):
        a = layer.self_attn
        for name, t in (("attn_norm", layer.input_layernorm.weight),
                        ("ffn_norm", layer.post_attention_layernorm.weight),
                        ("attn_q_norm", a.q_norm.weight), ("attn_k_norm", a.k_norm.weight)):
            _tensor(w, f"blk.{i}.{name}.weight", t, f32)
        for name, mod in (("attn_q", a.q_proj), ("attn_k", a.k_proj), ("attn_v", a.v_proj),
                          ("attn_output", a.o_proj)):
            _tensor(w, f"blk.{i}.{name}.weight", mod.weight, qtype)


def _finish(w: gguf.GGUFWriter, path: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def export_qwen3(model, path: Path, weights: str) -> Path:
    """weights: "Q8_0" or "Q4_0" (projections and FFN; the embedding/head Q8_0), or "F16"
    (every matrix F16: the input llama.cpp's own quantizer takes, bench/decode.py's K-quant
    run)."""
    qtype = getattr(gguf.GGMLQuantizationType, weights)
    w = gguf.GGUFWriter(str(path), "qwen3")
    _header(w, model.config, weights)
    _common_tensors(w, model, qtype)
    for i, layer in enumerate(model.model.layers):
        mlp = layer.mlp
        for name, mod in (("ffn_gate", mlp.gate_proj), ("ffn_up", mlp.up_proj),
                          ("ffn_down", mlp.down_proj)):
            _tensor(w, f"blk.{i}.{name}.weight", mod.weight, qtype)
    return _finish(w, path)


def export_qwen3_moe(model, path: Path, weights: str) -> Path:
    """A Qwen3-MoE host (every layer routed, `norm_topk_prob`, which llama.cpp's qwen3moe graph
    always applies): weights as export_qwen3, the banks in the same type, routers F32."""
    cfg = model.config
    if not cfg.norm_topk_prob or getattr(cfg, "mlp_only_layers", None):
        raise ValueError("llama.cpp's qwen3moe takes every layer routed with norm_topk_prob")
    qtype = getattr(gguf.GGMLQuantizationType, weights)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    _header(w, cfg, weights)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    _common_tensors(w, model, qtype)
    for i, layer in enumerate(model.model.layers):
        experts, f = layer.mlp.experts, cfg.moe_intermediate_size
        _tensor(w, f"blk.{i}.ffn_gate_inp.weight", layer.mlp.gate.weight,
                gguf.GGMLQuantizationType.F32)
        _tensor(w, f"blk.{i}.ffn_gate_exps.weight", experts.gate_up_proj[:, :f], qtype)
        _tensor(w, f"blk.{i}.ffn_up_exps.weight", experts.gate_up_proj[:, f:], qtype)
        _tensor(w, f"blk.{i}.ffn_down_exps.weight", experts.down_proj, qtype)
    return _finish(w, path)


def _rows_paired(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """q or k rows reordered for llama.cpp's rotary of adjacent pairs (its `llama` graphs): each
    head's halves interleaved, as llama.cpp's converter permutes them, so the same rotation
    results from the host's rotate-half."""
    rows, cols = weight.shape
    return (weight.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2)
            .reshape(rows, cols))


def export_granite(model, path: Path, weights: str) -> Path:
    """A Granite host as llama.cpp's `granite` architecture: Llama's tensors (q and k rows paired
    for its rotary) and the four multipliers as its embedding, residual, attention and logit
    scales; weights as export_qwen3."""
    cfg = model.config
    qtype = getattr(gguf.GGMLQuantizationType, weights)
    f32 = gguf.GGMLQuantizationType.F32
    w = gguf.GGUFWriter(str(path), "granite")
    _header(w, cfg, weights)
    w.add_embedding_scale(cfg.embedding_multiplier)
    w.add_residual_scale(cfg.residual_multiplier)
    w.add_attention_scale(cfg.attention_multiplier)
    w.add_logit_scale(cfg.logits_scaling)
    inner = model.model
    _stack_ends(w, model, inner.norm.weight)
    for i, layer in enumerate(inner.layers):
        a, mlp = layer.self_attn, layer.mlp
        _tensor(w, f"blk.{i}.attn_norm.weight", layer.input_layernorm.weight, f32)
        _tensor(w, f"blk.{i}.ffn_norm.weight", layer.post_attention_layernorm.weight, f32)
        _tensor(w, f"blk.{i}.attn_q.weight",
                _rows_paired(a.q_proj.weight.detach(), cfg.num_attention_heads), qtype)
        _tensor(w, f"blk.{i}.attn_k.weight",
                _rows_paired(a.k_proj.weight.detach(), cfg.num_key_value_heads), qtype)
        for name, mod in (("attn_v", a.v_proj), ("attn_output", a.o_proj),
                          ("ffn_gate", mlp.gate_proj), ("ffn_up", mlp.up_proj),
                          ("ffn_down", mlp.down_proj)):
            _tensor(w, f"blk.{i}.{name}.weight", mod.weight, qtype)
    return _finish(w, path)


def export_gemma3(model, path: Path, weights: str) -> Path:
    """A Gemma 3 text host as llama.cpp's `gemma3`: norms written as 1 + w (its graph multiplies
    by the stored weight, as llama.cpp's converter writes them), the four norms of a layer and
    the per-head q/k norms, the sliding window; llama.cpp takes its five-local-to-one-global
    pattern, the local base 10000 and the embedding's sqrt(hidden) from the architecture, which
    bench/families.py's Gemma 3 host declares the same. Weights as export_qwen3."""
    cfg = model.config
    qtype = getattr(gguf.GGMLQuantizationType, weights)
    f32 = gguf.GGMLQuantizationType.F32
    w = gguf.GGUFWriter(str(path), "gemma3")
    _header(w, cfg, weights)
    w.add_sliding_window(cfg.sliding_window)
    inner = model.model
    plus_one = lambda t: t.detach().float() + 1.0  # noqa: E731
    _stack_ends(w, model, plus_one(inner.norm.weight))
    for i, layer in enumerate(inner.layers):
        a, mlp = layer.self_attn, layer.mlp
        for name, norm in (("attn_norm", layer.input_layernorm),
                           ("post_attention_norm", layer.post_attention_layernorm),
                           ("ffn_norm", layer.pre_feedforward_layernorm),
                           ("post_ffw_norm", layer.post_feedforward_layernorm),
                           ("attn_q_norm", a.q_norm), ("attn_k_norm", a.k_norm)):
            _tensor(w, f"blk.{i}.{name}.weight", plus_one(norm.weight), f32)
        for name, mod in (("attn_q", a.q_proj), ("attn_k", a.k_proj), ("attn_v", a.v_proj),
                          ("attn_output", a.o_proj), ("ffn_gate", mlp.gate_proj),
                          ("ffn_up", mlp.up_proj), ("ffn_down", mlp.down_proj)):
            _tensor(w, f"blk.{i}.{name}.weight", mod.weight, qtype)
    return _finish(w, path)

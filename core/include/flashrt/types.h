// The core's vocabulary types: parsed once from names (catalog files, the door), carried as enums
// everywhere after (STYLE (f): strings are for messages and paths). Each has one name table here.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace frt {

// Element types a host may hold. Tensor views the kernels read are f32 or bf16 (i64: a routed
// bank's expert indices; boolean: an attention mask); the others are named so a refusal can say
// what the host has.
enum class DType : int32_t { f32, bf16, f16, f64, i64, other, boolean, i32 };

// What a feed-forward's activation computes (measured by the door, never read from a class name).
enum class Activation : int32_t {
  silu = FRT_ACT_SILU,
  gelu_tanh = FRT_ACT_GELU_TANH,
  gelu = FRT_ACT_GELU,
  relu = 100,     // recognised, no kernel computes it
  unknown = 101,  // an elementwise nonlinearity that matched no reference
};

// Packed weight layouts (frt_kernel_abi.h, "weight formats").
enum class WeightFormat : int32_t {
  int8_channel = FRT_W_INT8_CHANNEL,
  int4_group = FRT_W_INT4_GROUP,
  int8_group = FRT_W_INT8_GROUP,
  int4_super = FRT_W_INT4_SUPER,  // GGUF Q4_K: int4 g32 under 6-bit codes and f16 super scales
  int8_super = FRT_W_INT8_SUPER,  // GGUF Q6_K: int8 g16 under int8 codes and an f16 super scale
  int8_gemm = FRT_W_INT8_GEMM,    // the w8a8 GEMM's layout (activations quantized per row)
  int4_gemm = FRT_W_INT4_GEMM,    // int4 g32 for the same GEMM (activations per block of 32)
  int4_super_gemm = FRT_W_INT4_SUPER_GEMM,  // int4_super's values laid out as int4_gemm
  int6_super_gemm = FRT_W_INT6_SUPER_GEMM,  // int8_super's (Q6_K's) values in 6 bits, the same
  int5_gemm = FRT_W_INT5_GEMM,              // GGUF Q5_0 / Q5_1: 5-bit values in groups of 32
  int5_super_gemm = FRT_W_INT5_SUPER_GEMM,  // GGUF Q5_K: 5-bit values under int4_super's records
};
// How plans and packs describe int4_super (the same words on both sides, so an adopted pack is
// recognised as the form the plan seats).
inline constexpr const char* kInt4SuperForm =
    "int4 g32 in super-blocks of 256, 6-bit scale and min codes under f16 scales";
inline constexpr const char* kInt8SuperForm =
    "int8 g16 in super-blocks of 256, int8 scale codes under f16 scales";
inline constexpr const char* kInt4SuperGemmForm =
    "int4 g32 in super-blocks of 256, 6-bit scale and min codes under f16 scales, activations "
    "int8 per 32";
inline constexpr const char* kInt6SuperGemmForm =
    "int6 g16 in super-blocks of 256, int8 scale codes under f16 scales, activations int8 per 32";
inline constexpr const char* kInt5SuperGemmForm =
    "int5 g32 in super-blocks of 256, 6-bit scale and min codes under f16 scales, activations "
    "int8 per 32";
inline bool is_super_format(WeightFormat f) {
  return f == WeightFormat::int4_super || f == WeightFormat::int8_super ||
         f == WeightFormat::int4_super_gemm || f == WeightFormat::int6_super_gemm ||
         f == WeightFormat::int5_super_gemm;
}
// The forms only a checkpoint's own values arrive in (from_quantized): no host packer.
inline bool adopted_only_format(WeightFormat f) {
  return f == WeightFormat::int5_gemm || f == WeightFormat::int5_super_gemm;
}
// The multiple every input width of a group form must be: its group, or int4_super's
// super-block of 256.
inline int64_t width_multiple(WeightFormat f, int group) {
  return is_super_format(f) ? FRT_SUPER_K : group;
}
inline bool is_group_format(WeightFormat f) {
  return f == WeightFormat::int4_group || f == WeightFormat::int8_group ||
         f == WeightFormat::int4_gemm || f == WeightFormat::int5_gemm || is_super_format(f);
}

// The ops kernel packages own (frt_op_kind).
enum class OpKind : int32_t {
  linear = FRT_OP_LINEAR,
  gated_ffn = FRT_OP_GATED_FFN,
  ffn = FRT_OP_FFN,
  rmsnorm = FRT_OP_RMSNORM,
  rotary = FRT_OP_ROTARY,
  attention = FRT_OP_ATTENTION,
  dense = FRT_OP_DENSE,
  moe_ffn = FRT_OP_MOE_FFN,
  capped_attention = FRT_OP_CAPPED_ATTENTION,
  gated_delta = FRT_OP_GATED_DELTA,
  causal_conv1d = FRT_OP_CAUSAL_CONV1D,
  gated_act = FRT_OP_GATED_ACT,
  paged_attention = FRT_OP_PAGED_ATTENTION,
  cache_attention = FRT_OP_CACHE_ATTENTION,
  sequence_attention = FRT_OP_SEQUENCE_ATTENTION,
  // Not a kernel's op: a decoder layer run as one seat through the seats of its sublayers
  // (runtime/block_seat.cpp). No package owns it and no descriptor carries it.
  block = 1000,
};
// The ops of function structures: they read no packed weight and run at the host's precision,
// replacing a function a host module calls (its own arguments in, its own results out) or a
// module that is one (rmsnorm: a norm's forward).
inline bool function_op(OpKind op) {
  return op == OpKind::gated_delta || op == OpKind::causal_conv1d || op == OpKind::rmsnorm ||
         op == OpKind::attention || op == OpKind::rotary || op == OpKind::paged_attention ||
         op == OpKind::sequence_attention;
}

// How a gate scores a forward's output (DESIGN §7).
enum class OutputKind : int32_t { values, distribution };

// What a norm computes, as the door measured it: (x - mean) / std, x / rms(x) times w or (1 + w),
// or something else; unknown where nothing was measured.
enum class NormForm : int32_t { unknown, layer, rms, rms_one_plus, other };

// The rotary form a host declares (transformers' rope_type; `plain` is named "default"). A name
// outside the table is `other`, and the host graph keeps the declared name for messages.
enum class RopeKind : int32_t {
  plain,
  linear,
  dynamic,
  yarn,
  longrope,
  llama3,
  proportional,
  other
};

// What a module's recurrence computes, as the door measured it by calling the function the
// module calls on inputs of its own: the gated delta rule (ABI frt_gated_delta_args), or another
// recurrence (`other`).
enum class RecurrenceForm : int32_t { unknown, gated_delta, other };

// What a module's attention calls compute, as the door saw them through the host's attention
// interface: softmax(q k^T * scale) v over the keys and values the module hands (grouped query
// heads), the scores softcapped first (`softcapped`), or something the op does not compute
// (`other`: attention sinks, a position bias, value heads of another size).
enum class AttentionForm : int32_t { unknown, softmax, softcapped, other };

// Where a module's attention reads its keys and values: those each call hands, kept by the host
// between calls (`dense`: transformers' cache), a serving engine's pool of slots named by its slot
// table (`paged`), or the whole sequence each call hands, nothing kept (`none`: a diffusion
// transformer's attention over its image and text tokens, through torch's
// scaled_dot_product_attention). A structure's attention node matches one of them.
enum class AttentionCache : int32_t { dense, paged, none };

// How a module's rotary function pairs a head's dims, as the door measured it by calling the
// function on inputs of its own: element i with i + head_dim/2 (`half`: transformers'
// rotate_half), neighbours 2i and 2i+1 (`interleaved`), or something else (`other`: a partial
// rotary, another layout).
enum class RotaryForm : int32_t { unknown, half, interleaved, other };

// How a module's call composes its children, as the door measured it on the observed forward
// (exact identities on the tensors it saw): y = h + ffn(post_norm(h)), h = x + attn(norm(x))
// (`pre_norm_residual`: Llama, Qwen, Mistral), or anything else (`other`: a scaled residual, a
// norm after the sublayer, a parallel block).
enum class BlockForm : int32_t { unknown, pre_norm_residual, other };

const char* name_of(DType v);
const char* name_of(Activation v);
const char* name_of(WeightFormat v);
const char* name_of(OpKind v);
const char* name_of(OutputKind v);
const char* name_of(NormForm v);
const char* name_of(RopeKind v);
const char* name_of(RecurrenceForm v);
const char* name_of(AttentionForm v);
const char* name_of(AttentionCache v);
const char* name_of(RotaryForm v);
const char* name_of(BlockForm v);

// Every value of an enum with its name, in table order: the one definition bindings read (for
// DType, Activation, WeightFormat, OpKind, OutputKind, NormForm, RopeKind, RecurrenceForm,
// AttentionForm, AttentionCache, RotaryForm, BlockForm).
template <typename E>
std::vector<std::pair<E, std::string_view>> enum_entries();

// nullopt for a name outside the table; known_*() lists the table for the message.
std::optional<DType> parse_dtype(std::string_view name);
std::optional<Activation> parse_activation(std::string_view name);
std::optional<WeightFormat> parse_weight_format(std::string_view name);
std::optional<OpKind> parse_op(std::string_view name);
std::optional<OutputKind> parse_output_kind(std::string_view name);
std::optional<NormForm> parse_norm_form(std::string_view name);
std::optional<RopeKind> parse_rope_kind(std::string_view name);
std::optional<RecurrenceForm> parse_recurrence_form(std::string_view name);
std::optional<AttentionForm> parse_attention_form(std::string_view name);
std::optional<AttentionCache> parse_attention_cache(std::string_view name);
std::optional<RotaryForm> parse_rotary_form(std::string_view name);
std::optional<BlockForm> parse_block_form(std::string_view name);
std::string known_dtypes();
std::string known_activations();
std::string known_weight_formats();
std::string known_ops();
std::string known_output_kinds();
std::string known_norm_forms();
std::string known_rope_kinds();
std::string known_recurrence_forms();
std::string known_attention_forms();
std::string known_attention_caches();
std::string known_rotary_forms();
std::string known_block_forms();

// The weight operands an op reads, by the ABI's names (frt_linear_args.w is "weight";
// frt_ffn_args' gate, up, down); a region op's structure must have slots of these names.
const std::vector<std::string>& op_weight_operands(OpKind op);

// True for the activations kernels compute (silu, gelu_tanh, gelu).
inline bool kernel_activation(Activation a) {
  return a == Activation::silu || a == Activation::gelu_tanh || a == Activation::gelu;
}

// True for the element types kernels read (f32, bf16).
inline bool kernel_dtype(DType d) { return d == DType::f32 || d == DType::bf16; }

// The ABI's code for an element type (frt_dtype), the one mapping the planner's descriptors and
// the runtime's call arguments share. A type the ABI has no code for (f64, other) maps to -1,
// which no kernel takes: asking a kernel about f16 or f64 data as if it were bf16 or f32 would
// have it read the wrong element size.
inline int32_t abi_dtype(DType d) {
  switch (d) {
    case DType::f32:
      return FRT_F32;
    case DType::bf16:
      return FRT_BF16;
    case DType::f16:
      return FRT_F16;
    case DType::f64:
    case DType::i64:
    case DType::i32:
    case DType::other:
    case DType::boolean:
      break;
  }
  return -1;
}

}  // namespace frt

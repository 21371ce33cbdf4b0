// The core's vocabulary types: parsed once from names (catalog files, the door), carried as enums
// everywhere after (STYLE (f): strings are for messages and paths). Each has one name table here.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace frt {

// Element types a host may hold. Tensor views the kernels read are f32 or bf16; the others are
// named so a refusal can say what the host has.
enum class DType : int32_t { f32, bf16, f16, f64, other };

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
  int8_gemm = FRT_W_INT8_GEMM,  // the w8a8 GEMM's layout (activations quantized per row)
  int4_gemm = FRT_W_INT4_GEMM,  // int4 g32 for the same GEMM (activations per block of 32)
};
inline bool is_group_format(WeightFormat f) {
  return f == WeightFormat::int4_group || f == WeightFormat::int8_group ||
         f == WeightFormat::int4_gemm;
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
};

// How a gate scores a forward's output (DESIGN §7).
enum class OutputKind : int32_t { values, distribution };

const char* name_of(DType v);
const char* name_of(Activation v);
const char* name_of(WeightFormat v);
const char* name_of(OpKind v);
const char* name_of(OutputKind v);

// nullopt for a name outside the table; known_*() lists the table for the message.
std::optional<DType> parse_dtype(std::string_view name);
std::optional<Activation> parse_activation(std::string_view name);
std::optional<WeightFormat> parse_weight_format(std::string_view name);
std::optional<OpKind> parse_op(std::string_view name);
std::optional<OutputKind> parse_output_kind(std::string_view name);
std::string known_dtypes();
std::string known_activations();
std::string known_weight_formats();
std::string known_ops();
std::string known_output_kinds();

// The weight operands an op reads, by the ABI's names (frt_linear_args.w is "weight";
// frt_ffn_args' gate, up, down); a region op's structure must have slots of these names.
const std::vector<std::string>& op_weight_operands(OpKind op);

// True for the activations kernels compute (silu, gelu_tanh, gelu).
inline bool kernel_activation(Activation a) {
  return a == Activation::silu || a == Activation::gelu_tanh || a == Activation::gelu;
}

// True for the element types kernels read (f32, bf16).
inline bool kernel_dtype(DType d) { return d == DType::f32 || d == DType::bf16; }

}  // namespace frt

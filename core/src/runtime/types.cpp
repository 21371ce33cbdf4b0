#include <flashrt/types.h>

#include <array>
#include <utility>

namespace frt {
namespace {

template <typename E, size_t N>
using Table = std::array<std::pair<E, std::string_view>, N>;

constexpr Table<DType, 8> kDTypes{{{DType::f32, "f32"},
                                   {DType::bf16, "bf16"},
                                   {DType::f16, "f16"},
                                   {DType::f64, "f64"},
                                   {DType::i64, "i64"},
                                   {DType::other, "other"},
                                   {DType::boolean, "bool"},
                                   {DType::i32, "i32"}}};
constexpr Table<Activation, 5> kActivations{{{Activation::silu, "silu"},
                                             {Activation::gelu_tanh, "gelu_tanh"},
                                             {Activation::gelu, "gelu"},
                                             {Activation::relu, "relu"},
                                             {Activation::unknown, "unknown"}}};
constexpr Table<WeightFormat, 11> kFormats{{{WeightFormat::int8_channel, "int8_channel"},
                                            {WeightFormat::int4_group, "int4_group"},
                                            {WeightFormat::int8_group, "int8_group"},
                                            {WeightFormat::int4_super, "int4_super"},
                                            {WeightFormat::int8_super, "int8_super"},
                                            {WeightFormat::int8_gemm, "int8_gemm"},
                                            {WeightFormat::int4_gemm, "int4_gemm"},
                                            {WeightFormat::int4_super_gemm, "int4_super_gemm"},
                                            {WeightFormat::int6_super_gemm, "int6_super_gemm"},
                                            {WeightFormat::int5_gemm, "int5_gemm"},
                                            {WeightFormat::int5_super_gemm, "int5_super_gemm"}}};
constexpr Table<OpKind, 16> kOps{{{OpKind::linear, "linear"},
                                  {OpKind::gated_ffn, "gated_ffn"},
                                  {OpKind::ffn, "ffn"},
                                  {OpKind::rmsnorm, "rmsnorm"},
                                  {OpKind::rotary, "rotary"},
                                  {OpKind::attention, "attention"},
                                  {OpKind::dense, "dense"},
                                  {OpKind::moe_ffn, "moe_ffn"},
                                  {OpKind::capped_attention, "capped_attention"},
                                  {OpKind::gated_delta, "gated_delta"},
                                  {OpKind::causal_conv1d, "causal_conv1d"},
                                  {OpKind::gated_act, "gated_act"},
                                  {OpKind::paged_attention, "paged_attention"},
                                  {OpKind::cache_attention, "cache_attention"},
                                  {OpKind::sequence_attention, "sequence_attention"},
                                  {OpKind::block, "block"}}};
constexpr Table<OutputKind, 2> kOutputKinds{
    {{OutputKind::values, "values"}, {OutputKind::distribution, "distribution"}}};
constexpr Table<NormForm, 5> kNormForms{{{NormForm::unknown, "unknown"},
                                         {NormForm::layer, "layer"},
                                         {NormForm::rms, "rms"},
                                         {NormForm::rms_one_plus, "rms_one_plus"},
                                         {NormForm::other, "other"}}};
constexpr Table<RopeKind, 8> kRopeKinds{{{RopeKind::plain, "default"},
                                         {RopeKind::linear, "linear"},
                                         {RopeKind::dynamic, "dynamic"},
                                         {RopeKind::yarn, "yarn"},
                                         {RopeKind::longrope, "longrope"},
                                         {RopeKind::llama3, "llama3"},
                                         {RopeKind::proportional, "proportional"},
                                         {RopeKind::other, "other"}}};
constexpr Table<RecurrenceForm, 3> kRecurrenceForms{{{RecurrenceForm::unknown, "unknown"},
                                                     {RecurrenceForm::gated_delta, "gated_delta"},
                                                     {RecurrenceForm::other, "other"}}};
constexpr Table<AttentionForm, 4> kAttentionForms{{{AttentionForm::unknown, "unknown"},
                                                   {AttentionForm::softmax, "softmax"},
                                                   {AttentionForm::softcapped, "softcapped"},
                                                   {AttentionForm::other, "other"}}};
constexpr Table<AttentionCache, 3> kAttentionCaches{{{AttentionCache::dense, "dense"},
                                                     {AttentionCache::paged, "paged"},
                                                     {AttentionCache::none, "none"}}};
constexpr Table<RotaryForm, 4> kRotaryForms{{{RotaryForm::unknown, "unknown"},
                                             {RotaryForm::half, "half"},
                                             {RotaryForm::interleaved, "interleaved"},
                                             {RotaryForm::other, "other"}}};
constexpr Table<BlockForm, 3> kBlockForms{{{BlockForm::unknown, "unknown"},
                                           {BlockForm::pre_norm_residual, "pre_norm_residual"},
                                           {BlockForm::other, "other"}}};

template <typename E, size_t N>
const char* name_in(const Table<E, N>& t, E v) {
  for (const auto& [e, n] : t)
    if (e == v) return n.data();
  return "?";
}

template <typename E, size_t N>
std::optional<E> parse_in(const Table<E, N>& t, std::string_view name) {
  for (const auto& [e, n] : t)
    if (n == name) return e;
  return std::nullopt;
}

template <typename E, size_t N>
std::string list_of(const Table<E, N>& t) {
  std::string out;
  for (const auto& [e, n] : t) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

}  // namespace

const char* name_of(DType v) { return name_in(kDTypes, v); }
const char* name_of(Activation v) { return name_in(kActivations, v); }
const char* name_of(WeightFormat v) { return name_in(kFormats, v); }
const char* name_of(OpKind v) { return name_in(kOps, v); }
const char* name_of(OutputKind v) { return name_in(kOutputKinds, v); }
const char* name_of(NormForm v) { return name_in(kNormForms, v); }
const char* name_of(RopeKind v) { return name_in(kRopeKinds, v); }
const char* name_of(RecurrenceForm v) { return name_in(kRecurrenceForms, v); }
const char* name_of(AttentionForm v) { return name_in(kAttentionForms, v); }
const char* name_of(AttentionCache v) { return name_in(kAttentionCaches, v); }
const char* name_of(RotaryForm v) { return name_in(kRotaryForms, v); }
const char* name_of(BlockForm v) { return name_in(kBlockForms, v); }
std::optional<DType> parse_dtype(std::string_view n) { return parse_in(kDTypes, n); }
std::optional<Activation> parse_activation(std::string_view n) { return parse_in(kActivations, n); }
std::optional<WeightFormat> parse_weight_format(std::string_view n) {
  return parse_in(kFormats, n);
}
std::optional<OpKind> parse_op(std::string_view n) { return parse_in(kOps, n); }
std::optional<OutputKind> parse_output_kind(std::string_view n) {
  return parse_in(kOutputKinds, n);
}
std::optional<NormForm> parse_norm_form(std::string_view n) { return parse_in(kNormForms, n); }
std::optional<RopeKind> parse_rope_kind(std::string_view n) { return parse_in(kRopeKinds, n); }
std::optional<RecurrenceForm> parse_recurrence_form(std::string_view n) {
  return parse_in(kRecurrenceForms, n);
}
std::optional<AttentionForm> parse_attention_form(std::string_view n) {
  return parse_in(kAttentionForms, n);
}
std::optional<AttentionCache> parse_attention_cache(std::string_view n) {
  return parse_in(kAttentionCaches, n);
}
std::optional<RotaryForm> parse_rotary_form(std::string_view n) {
  return parse_in(kRotaryForms, n);
}
std::optional<BlockForm> parse_block_form(std::string_view n) { return parse_in(kBlockForms, n); }
const std::vector<std::string>& op_weight_operands(OpKind op) {
  static const std::vector<std::string> kLinear = {"weight"}, kGated = {"gate", "up", "down"},
                                        kUngated = {"up", "down"}, kNone = {};
  switch (op) {
    case OpKind::linear:
      return kLinear;
    case OpKind::gated_ffn:
    case OpKind::moe_ffn:  // each expert's, in banks
      return kGated;
    case OpKind::ffn:
      return kUngated;
    default:
      return kNone;
  }
}

template <typename E, size_t N>
std::vector<std::pair<E, std::string_view>> entries_of(const Table<E, N>& t) {
  return {t.begin(), t.end()};
}

template <>
std::vector<std::pair<DType, std::string_view>> enum_entries<DType>() {
  return entries_of(kDTypes);
}
template <>
std::vector<std::pair<Activation, std::string_view>> enum_entries<Activation>() {
  return entries_of(kActivations);
}
template <>
std::vector<std::pair<WeightFormat, std::string_view>> enum_entries<WeightFormat>() {
  return entries_of(kFormats);
}
template <>
std::vector<std::pair<OpKind, std::string_view>> enum_entries<OpKind>() {
  return entries_of(kOps);
}
template <>
std::vector<std::pair<OutputKind, std::string_view>> enum_entries<OutputKind>() {
  return entries_of(kOutputKinds);
}
template <>
std::vector<std::pair<NormForm, std::string_view>> enum_entries<NormForm>() {
  return entries_of(kNormForms);
}
template <>
std::vector<std::pair<RopeKind, std::string_view>> enum_entries<RopeKind>() {
  return entries_of(kRopeKinds);
}
template <>
std::vector<std::pair<RecurrenceForm, std::string_view>> enum_entries<RecurrenceForm>() {
  return entries_of(kRecurrenceForms);
}
template <>
std::vector<std::pair<AttentionForm, std::string_view>> enum_entries<AttentionForm>() {
  return entries_of(kAttentionForms);
}
template <>
std::vector<std::pair<AttentionCache, std::string_view>> enum_entries<AttentionCache>() {
  return entries_of(kAttentionCaches);
}
template <>
std::vector<std::pair<RotaryForm, std::string_view>> enum_entries<RotaryForm>() {
  return entries_of(kRotaryForms);
}
template <>
std::vector<std::pair<BlockForm, std::string_view>> enum_entries<BlockForm>() {
  return entries_of(kBlockForms);
}

std::string known_dtypes() { return list_of(kDTypes); }
std::string known_activations() { return list_of(kActivations); }
std::string known_weight_formats() { return list_of(kFormats); }
std::string known_ops() { return list_of(kOps); }
std::string known_output_kinds() { return list_of(kOutputKinds); }
std::string known_norm_forms() { return list_of(kNormForms); }
std::string known_rope_kinds() { return list_of(kRopeKinds); }
std::string known_recurrence_forms() { return list_of(kRecurrenceForms); }
std::string known_attention_forms() { return list_of(kAttentionForms); }
std::string known_attention_caches() { return list_of(kAttentionCaches); }
std::string known_rotary_forms() { return list_of(kRotaryForms); }
std::string known_block_forms() { return list_of(kBlockForms); }

}  // namespace frt

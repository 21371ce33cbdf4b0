#include <flashrt/errors.h>
#include <flashrt/op_dispatch.h>

#include <string>
#include <vector>

namespace frt {
namespace {

frt_op_desc weights_desc(OpKind op, const frt_packed_weight& w) {
  frt_op_desc d{};
  d.op = static_cast<int32_t>(op);
  d.wformat = w.format;
  d.group = w.group;
  d.scale_dtype = w.scale_dtype;
  d.x_dtype = d.y_dtype = FRT_F32;
  d.rows_max = 1;
  return d;
}

// The descriptor's fields, named: the key a hub remembers its answer under.
std::string key_of(const frt_op_desc& d) {
  std::string key;
  for (const int64_t v : {int64_t{d.op}, int64_t{d.wformat}, int64_t{d.group}, int64_t{d.act},
                          int64_t{d.x_dtype}, int64_t{d.y_dtype}, int64_t{d.has_bias}, d.rows_max,
                          d.n, d.k, d.inner, int64_t{d.scale_dtype}})
    key += std::to_string(v) + ",";
  return key;
}

const frt_kernel_table& table_for(KernelHub& hub, const frt_op_desc& desc,
                                  const std::string& what) {
  const std::string key = key_of(desc);
  if (const frt_kernel_table* known = hub.op_choice(key)) return *known;
  std::string answers;
  for (const std::string& repo : hub.visible_packages()) {
    const PackageResolution& r = hub.resolve(repo);
    const std::string why =
        r.table == nullptr ? "not loaded on this machine" : form_refusal(*r.table, desc);
    if (why.empty()) {
      hub.remember_op_choice(key, r.table);
      return *r.table;
    }
    answers += (answers.empty() ? "" : "; ") + repo + ": " + why;
  }
  throw KernelUnavailable("no kernel package on the path runs " + what + " (" +
                          (answers.empty() ? "no package is on the path" : answers) + ")");
}

}  // namespace

const frt_kernel_table& linear_table(KernelHub& hub, const PackedLinear& w, bool has_bias) {
  frt_op_desc d = weights_desc(OpKind::linear, w.view());
  d.n = w.n();
  d.k = w.k();
  d.has_bias = has_bias;
  return table_for(hub, d, "linear over " + w.form());
}

const frt_kernel_table& ffn_table(KernelHub& hub, const FfnOperands& f) {
  frt_op_desc d = weights_desc(f.kind(), f.up->view());
  d.act = static_cast<int32_t>(f.act);
  d.k = f.up->k();
  d.inner = f.up->n();
  d.n = f.down->n();
  d.has_bias = f.up_bias != nullptr || f.down_bias != nullptr;
  return table_for(hub, d, std::string(name_of(f.kind())) + " over " + f.up->form());
}

const frt_kernel_table& sequence_attention_table(KernelHub& hub, DType dtype, int64_t head_dim) {
  frt_op_desc d{};
  d.op = FRT_OP_SEQUENCE_ATTENTION;
  d.x_dtype = d.y_dtype = abi_dtype(dtype);
  d.k = head_dim;
  return table_for(hub, d,
                   std::string("sequence_attention over ") + name_of(dtype) + " heads of " +
                       std::to_string(head_dim));
}

}  // namespace frt

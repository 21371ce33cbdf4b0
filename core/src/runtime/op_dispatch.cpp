#include <flashrt/errors.h>
#include <flashrt/op_dispatch.h>

#include <cstring>
#include <map>
#include <mutex>
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

// Descriptors compare as bytes (a plain struct, zero-initialised).
struct DescLess {
  bool operator()(const frt_op_desc& a, const frt_op_desc& b) const {
    return std::memcmp(&a, &b, sizeof(frt_op_desc)) < 0;
  }
};

const frt_kernel_table& table_for(KernelHub& hub, const frt_op_desc& desc,
                                  const std::string& what) {
  static std::mutex mu;
  static std::map<const KernelHub*, std::map<frt_op_desc, const frt_kernel_table*, DescLess>>
      chosen;
  std::lock_guard<std::mutex> lock(mu);
  auto& cache = chosen[&hub];
  if (const auto it = cache.find(desc); it != cache.end()) return *it->second;
  std::string answers;
  for (const std::string& repo : hub.visible_packages()) {
    const PackageResolution& r = hub.resolve(repo);
    const std::string why =
        r.table == nullptr ? "not loaded on this machine" : form_refusal(*r.table, desc);
    if (why.empty()) {
      cache[desc] = r.table;
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

}  // namespace frt

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/host_graph.h>

#include <algorithm>

namespace frt {

const HostModule* HostGraph::find(const std::string& path) const {
  for (const HostModule& m : modules)
    if (m.path == path) return &m;
  return nullptr;
}

std::vector<const HostCall*> HostGraph::calls_of(const std::string& path) const {
  std::vector<const HostCall*> out;
  for (const HostCall& c : calls)
    if (c.path == path) out.push_back(&c);
  return out;
}

std::string router_refusal(const HostModule& m, int64_t experts, int64_t hidden) {
  const std::string named = m.path + " (" + m.type_name + ")";
  const RouterFacts& r = m.router;
  if (r.form == RouterForm::unknown) return "the door measured no routing at " + named;
  if (r.form == RouterForm::other)
    return named + " does not route as the top-k of softmax(x W^T): " + r.other;
  if (r.experts != experts || r.hidden != hidden)
    return named + " routes over [" + std::to_string(r.experts) + "x" + std::to_string(r.hidden) +
           "]; the bank holds " + std::to_string(experts) + " experts of width " +
           std::to_string(hidden);
  if (r.top_k < 1 || r.top_k > r.experts || r.top_k > FRT_MAX_TOP_K)
    return named + " picks " + std::to_string(r.top_k) + " of " + std::to_string(r.experts) +
           " experts; the core routes 1.." +
           std::to_string(std::min<int64_t>(r.experts, FRT_MAX_TOP_K)) + " of them a row";
  return "";
}

}  // namespace frt

#include <flashrt/host_graph.h>

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

}  // namespace frt

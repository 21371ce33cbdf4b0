// The kernel path's configuration (DESIGN §5): LOCAL_KERNELS, FLASHRT_KERNEL_PATH and the
// FRT_KERNEL_REV_<PACKAGE> pins, read from the environment into a KernelPathConfig.
#include <flashrt/errors.h>
#include <flashrt/hub.h>
#include <flashrt/utf8.h>

#include <cctype>
#include <cstring>
#include <set>

extern char** environ;

namespace frt {
namespace {

constexpr const char* kPinPrefix = "FRT_KERNEL_REV_";

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));  // empty elements ignored
    start = end + 1;
  }
  return out;
}

}  // namespace

std::string pin_variable(const std::string& repo) {
  std::string out = kPinPrefix;
  for (unsigned char c : repo) out.push_back(std::isalnum(c) ? std::toupper(c) : '_');
  return out;
}

KernelPathConfig KernelPathConfig::from_env(std::string bundled_root,
                                            const std::vector<std::string>& repos,
                                            const Getenv& getenv) {
  KernelPathConfig c;
  c.bundled_root = std::move(bundled_root);
  if (const char* lk = getenv("LOCAL_KERNELS")) {
    for (const std::string& item : split(lk, ':')) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
        throw InvalidArgument("LOCAL_KERNELS: element '" + escape_invalid_utf8(item) +
                              "' is not <org>/<package>=<path>");
      }
      c.local_kernels.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    }
  }
  if (const char* kp = getenv("FLASHRT_KERNEL_PATH")) c.roots = split(kp, ':');

  std::set<std::string> named;
  for (const std::string& repo : repos) {
    const std::string var = pin_variable(repo);
    named.insert(var);
    const char* rev = getenv(var.c_str());
    if (rev != nullptr && *rev != '\0') c.pins[repo] = rev;
  }
  // Pins for repos nobody listed: names come from the real environment, values through `getenv`
  // so a test's fake environment stays the only source of values.
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    const std::string name(*e, static_cast<size_t>(eq - *e));
    if (name.rfind(kPinPrefix, 0) != 0 || named.count(name)) continue;
    const char* rev = getenv(name.c_str());
    if (rev != nullptr && *rev != '\0') c.pin_variables[name] = rev;
  }
  return c;
}

}  // namespace frt

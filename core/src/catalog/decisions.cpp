// Reading a machine decisions file (core/include/flashrt/decisions.h).
#include <flashrt/decisions.h>
#include <flashrt/errors.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace frt {

std::optional<int64_t> MachineDecisions::rows_min_for(const std::string& form) const {
  if (!ignored.empty()) return std::nullopt;
  const auto it = rows_min.find(form);
  if (it == rows_min.end()) return std::nullopt;
  return it->second;
}

MachineDecisions read_decisions(const std::string& path, const CpuFeatures& cpu) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument("decisions file " + path + ": cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return InvalidArgument("decisions file " + path + ": " + what);
  };
  if (!j.is_object()) throw bad("not a JSON object");
  if (!j.contains("schema") || !j["schema"].is_string() ||
      j["schema"].get<std::string>() != "flashrt-decisions/1")
    throw bad("schema is not flashrt-decisions/1");
  MachineDecisions d;
  d.path = path;
  if (!j.contains("cpu") || !j["cpu"].is_string() || !j.contains("tier") || !j["tier"].is_string())
    throw bad("no cpu or tier string");
  d.cpu = j["cpu"].get<std::string>();
  d.tier = j["tier"].get<std::string>();
  if (!j.contains("forms") || !j["forms"].is_object()) throw bad("no forms object");
  for (const auto& [form, entry] : j["forms"].items()) {
    if (!entry.is_object() || !entry.contains("rows_min") || !entry["rows_min"].is_number_integer())
      throw bad("form " + form + " has no integer rows_min");
    const int64_t rows = entry["rows_min"].get<int64_t>();
    // A band the file moves is a GEMM form's, above the decode band the decode forms serve.
    if (rows <= kDecisionsDecodeRows)
      throw bad("form " + form + " has rows_min " + std::to_string(rows) +
                " inside the decode band (1.." + std::to_string(kDecisionsDecodeRows) + ")");
    d.rows_min[form] = rows;
  }
  if (d.cpu != cpu.model)
    d.ignored = "measured on " + d.cpu + ", this CPU is " + cpu.model;
  else if (d.tier != cpu.tier())
    d.ignored = "measured at tier " + d.tier + ", this process runs tier " + cpu.tier();
  return d;
}

}  // namespace frt

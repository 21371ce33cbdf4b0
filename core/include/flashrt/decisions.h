// Machine decisions: band constants re-measured on one machine (`python -m flashrt_structures
// tune`), which the planner reads in place of the catalog's defaults. The catalog stays the
// default and the schema; a decisions file only moves a value the catalog declares, and only on
// the CPU it was measured on.
#pragma once

#include <flashrt/cpu_features.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace frt {

// A decided band starts above the decode band (1..16, the kernels' FRT_MAX_ROWS); only forms
// whose own band starts there are moved (never an every-row-count form's).
inline constexpr int64_t kDecisionsDecodeRows = 16;

struct MachineDecisions {
  std::string path;  // where they were read ("" = none)
  std::string cpu;   // the CPU they were measured on (CpuFeatures::model)
  std::string tier;  // and its tier
  // Per weight form of the catalog with a row band of its own: the first row count from which the
  // form beats the host here.
  std::map<std::string, int64_t> rows_min;
  std::string ignored;  // not "": read but not applied, and why (another CPU or tier)

  std::optional<int64_t> rows_min_for(const std::string& form) const;
};

// Reads a decisions file (JSON: {"schema": "flashrt-decisions/1", "cpu", "tier", "forms":
// {"<form>": {"rows_min": N}}}). A file measured on another CPU model or tier is returned with
// `ignored` saying so; a file that is not one throws InvalidArgument naming what is wrong.
MachineDecisions read_decisions(const std::string& path, const CpuFeatures& cpu);

}  // namespace frt

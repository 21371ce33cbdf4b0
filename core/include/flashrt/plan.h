// The planner: discovery of seams on a HostGraph, qualification of impls per seam, schemes and
// ladders, into a Plan that is explained before anything is swapped (DESIGN §4). The door
// executes a plan; it decides nothing the plan should.
#pragma once

#include <flashrt/host_graph.h>
#include <flashrt/hub.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace frt {

// One region a structure describes, as found on the host.
struct Seam {
  std::string site;                          // module path the seat replaces
  std::string structure;                     // "linear_proj", "decoder_ffn", "lm_head"
  std::map<std::string, std::string> slots;  // slot -> module path holding it
  std::string activation;                    // decoder_ffn
  int64_t in_features = 0, out_features = 0, intermediate = 0;
  std::string weight_dtype, act_dtype;
  std::vector<int64_t> rows_seen;
  bool tied = false;  // lm_head sharing the input embedding's weight
};

using SiteReason = std::pair<std::string, std::string>;

struct Discovery {
  std::vector<Seam> seams;
  std::vector<SiteReason> refused;  // recognised, but outside the boundary
  std::vector<std::string> assumed;
};

// Finds the seams of `structures` (names from the catalog) on the host.
Discovery discover(const HostGraph& graph, const std::vector<std::string>& structures);

// A weight format an impl runs.
struct WeightForm {
  std::string format;  // "int8" or "int4"
  int group = 0;
  bool symmetric = true;
  std::string describe() const;  // "int8 per-channel", "int4 g32 symmetric"
};

// One seat the plan decided on.
struct SeatPlan {
  Seam seam;
  std::string impl;     // "linear_w8a16", "ffn_w4a16", ...
  std::string package;  // kernel package it runs on
  WeightForm form;
  int64_t band_min = 1, band_max = 16;  // decode rows; others run the host (band dispatch)
  std::vector<std::string> ladder;      // each step aside on the way to this impl
};

struct Scheme {
  std::string name;                              // "none", "w8a16_decode", ...
  std::map<std::string, WeightForm> formats;     // structure -> form
  std::map<std::string, std::string> keep_host;  // site -> reason (filled by plan())
};

// The schemes plan() knows: none, w8a16_decode, w4a16_decode, and auto (resolved here).
std::vector<std::string> scheme_names();

struct PlanOptions {
  std::vector<std::string> structures = {"linear_proj", "decoder_ffn", "lm_head"};
  std::string scheme = "auto";
  // Seams with fewer weights than this stay with the host. A count, not yet a per-machine
  // measurement: 65,536 int8 weights stream in ~2.5 us at ~26 GB/s, about what the door adds
  // to every seated call (~2 us measured), so below it a seat cannot pay for itself.
  int64_t min_seat_weights = 1 << 16;
};

struct Plan {
  Scheme scheme;
  std::vector<SeatPlan> seats;
  std::vector<SiteReason> keep_host;  // decisions, with reasons (not refusals)
  std::vector<SiteReason> refused;
  std::vector<std::string> assumed;
  std::vector<UnavailableEntry> kernel_unavailable;
  int64_t seams_found = 0;
};

// Throws InvalidArgument for an unknown scheme or structure name.
Plan plan(const HostGraph& graph, const PlanOptions& options, KernelHub& hub);

// What a pass decided, before anything is swapped: every seat, keep-at-host and refusal with
// its reason, and the counts.
std::string explain(const Plan& plan);

}  // namespace frt

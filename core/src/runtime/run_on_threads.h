// Runs one kernel-table call on every thread of a Parallel and turns the first failure into an
// exception: what every op driver in the core (linear, ffn, the decode program) needs.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/errors.h>
#include <flashrt/thread_pool.h>

#include <mutex>
#include <string>

namespace frt::detail {

// call(ith, team, err) -> frt_status, on up to nth threads (team of them: Parallel::run);
// throws InvalidArgument("<what>: <message>").
template <typename Call>
void run_on_threads(Parallel& par, int nth, const char* what, Call call) {
  std::mutex mu;
  std::string error;
  par.run(nth, [&](int ith, int team) {
    frt_error err{};
    if (call(ith, team, &err) != FRT_OK) {
      std::lock_guard lock(mu);
      if (error.empty()) error = err.message[0] ? err.message : "unknown kernel error";
    }
  });
  if (!error.empty()) throw InvalidArgument(std::string(what) + ": " + error);
}

}  // namespace frt::detail

// Deterministic input mutation for the parser fuzz tests (tests/fuzz/*_fuzz_test.cpp). Seeded,
// so a failing input is reproduced from (seed, index) alone; the generator is our own so the
// sequence does not depend on the standard library's distributions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace frt::fuzz {

// splitmix64: small, fast, and the same on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
  bool one_in(size_t n) { return below(n) == 0; }

 private:
  uint64_t state_;
};

enum class Syntax { kJson, kYaml };

struct Mutation {
  std::string text;
  std::string kind;  // what was done, e.g. "truncate", "deep-nesting+bit-flip"
};

// One mutated copy of `seed`. Structural mutations (wrong types, huge values, deep nesting,
// duplicate keys) read the seed's structure, so they are applied to the seed first; byte-level
// ones (truncation, random bytes, bit flips, insertion, deletion, invalid UTF-8) may follow.
Mutation mutate(std::string_view seed, Syntax syntax, Rng& rng);

// Inputs per parser and the seed, overridable for a longer run (see README, "Fuzzing").
size_t fuzz_inputs(size_t default_count);
uint64_t fuzz_seed();

}  // namespace frt::fuzz

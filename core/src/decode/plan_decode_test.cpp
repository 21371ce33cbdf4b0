// The decode plan's explain(): its refusals and assumptions grouped by index like a Plan's
// (Note [Explain groups]), verbose listing each. The plan itself is tested on real hosts by the
// door's tests (python/tests/test_decode.py).
#include <flashrt/decode_plan.h>
#include <gtest/gtest.h>

#include <string>

namespace frt {
namespace {

DecodePlan refused_in_three_layers() {
  DecodePlan p;
  p.binding = "llama_decode";
  for (int i : {0, 1, 3})
    p.refused.emplace_back("model.layers." + std::to_string(i) + ".self_attn.q_proj",
                           "a fused qkv projection");
  p.refused.emplace_back("", "batch 2 > 1");
  p.assumed.push_back("model.layers.0.mlp: gate and up read one tensor");
  p.assumed.push_back("model.layers.1.mlp: gate and up read one tensor");
  return p;
}

TEST(DecodePlanExplain, RefusalsAndAssumptionsAreGroupedByIndex) {
  const DecodePlan p = refused_in_three_layers();
  const std::string grouped = explain(p);
  EXPECT_NE(grouped.find("refused\n"), std::string::npos) << grouped;  // the header's verdict
  EXPECT_NE(grouped.find("\nrefused:\n  model.layers.{0..1,3}.self_attn.q_proj  a fused qkv "
                         "projection  x3\n  (host)  batch 2 > 1\n"),
            std::string::npos)
      << grouped;
  EXPECT_NE(
      grouped.find("\nassumed:\n  model.layers.{0..1}.mlp: gate and up read one tensor  x2\n"),
      std::string::npos)
      << grouped;
  EXPECT_NE(grouped.find("the verbose form lists each"), std::string::npos);
}

TEST(DecodePlanExplain, VerboseListsEachEntry) {
  const DecodePlan p = refused_in_three_layers();
  const std::string verbose = explain(p, /*verbose=*/true);
  for (int i : {0, 1, 3})
    EXPECT_NE(verbose.find("\n  model.layers." + std::to_string(i) +
                           ".self_attn.q_proj  a fused qkv projection\n"),
              std::string::npos)
        << verbose;
  EXPECT_NE(verbose.find("\n  (host)  batch 2 > 1\n"), std::string::npos);
  EXPECT_EQ(verbose.find("{0.."), std::string::npos);
  EXPECT_EQ(verbose.find("verbose form"), std::string::npos);
  // Same header either way.
  EXPECT_EQ(verbose.substr(0, verbose.find('\n')), explain(p).substr(0, explain(p).find('\n')));
}

}  // namespace
}  // namespace frt

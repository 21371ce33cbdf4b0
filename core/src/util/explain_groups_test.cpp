// explain()'s grouping on hand-written entries (Note [Explain groups]); the planner's tests check
// it on a plan.
#include "util/explain_groups.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace frt::detail {
namespace {

ExplainEntry line(const std::string& site, const std::string& rest) {
  return {site, "  " + site + "  " + rest + "\n"};
}

std::vector<ExplainEntry> layers(const std::vector<int>& indices, const std::string& rest) {
  std::vector<ExplainEntry> out;
  for (int i : indices) out.push_back(line("model.layers." + std::to_string(i) + ".mlp", rest));
  return out;
}

TEST(ExplainGroups, IndexSetsAreWrittenAsRuns) {
  EXPECT_EQ(index_set({0, 1, 2, 3}), "0..3");
  EXPECT_EQ(index_set({9, 7, 8, 5, 3, 2, 1, 0}), "0..3,5,7..9");
  EXPECT_EQ(index_set({4}), "4");
  EXPECT_EQ(index_set({0, 1}), "0..1");
  EXPECT_EQ(index_set({0, 2, 4}), "0,2,4");
  EXPECT_EQ(index_set({3, 3, 4}), "3..4");
}

TEST(ExplainGroups, ContiguousLayersAreOneLineWithTheirCount) {
  bool merged = false;
  const std::string text =
      group_entries(layers({0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14,
                            15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29},
                           "decoder_ffn gate/up [1536x576], down [576x1536] -> ffn_q4_1"),
                    &merged);
  EXPECT_TRUE(merged);
  EXPECT_EQ(text,
            "  model.layers.{0..29}.mlp  decoder_ffn gate/up [1536x576], down [576x1536] -> "
            "ffn_q4_1  x30\n");
}

TEST(ExplainGroups, NonContiguousIndicesAreWrittenCompactly) {
  std::vector<ExplainEntry> e = layers({0, 1, 2, 3, 5, 7, 8, 9}, "decoder_ffn -> ffn_w8g64a16");
  e.push_back(line("model.layers.4.mlp", "decoder_ffn: activation 'relu' outside {silu}"));
  EXPECT_EQ(group_entries(e),
            "  model.layers.{0..3,5,7..9}.mlp  decoder_ffn -> ffn_w8g64a16  x8\n"
            "  model.layers.4.mlp  decoder_ffn: activation 'relu' outside {silu}\n");
}

TEST(ExplainGroups, DifferentReasonsOrFormsAreNotMerged) {
  std::vector<ExplainEntry> e;
  e.push_back(line("layers.0.mlp", "decoder_ffn -> ffn_q4_1"));
  e.push_back(line("layers.1.mlp", "decoder_ffn -> ffn_q8_0"));
  e.push_back(line("layers.2.mlp", "decoder_ffn -> ffn_q4_1"));
  e.push_back(line("layers.3.mlp", "decoder_ffn -> ffn_q8_0"));
  e.push_back(line("layers.4.mlp", "decoder_ffn -> ffn_q8_0 (4096 weights)"));
  bool merged = false;
  EXPECT_EQ(group_entries(e, &merged),
            "  layers.{0,2}.mlp  decoder_ffn -> ffn_q4_1  x2\n"
            "  layers.{1,3}.mlp  decoder_ffn -> ffn_q8_0  x2\n"
            "  layers.4.mlp  decoder_ffn -> ffn_q8_0 (4096 weights)\n");
  EXPECT_TRUE(merged);
}

TEST(ExplainGroups, ASingleMemberIsPrintedAsItIsWithoutBracesOrCount) {
  const std::vector<ExplainEntry> e = {line("layers.0.mlp", "kept"), line("head", "kept"),
                                       line("layers.1.attn", "kept")};
  bool merged = true;
  EXPECT_EQ(group_entries(e, &merged),
            "  layers.0.mlp  kept\n  head  kept\n  layers.1.attn  kept\n");
  EXPECT_FALSE(merged);
  EXPECT_EQ(group_entries({}), "");
}

TEST(ExplainGroups, ThePathInsideTheReasonAndFollowingLinesIsGroupedWithTheSite) {
  std::vector<ExplainEntry> e;
  for (int i : {0, 1, 2}) {
    const std::string p = "blocks." + std::to_string(i);
    e.push_back({p + ".attn1",
                 "  " + p + ".attn1  qkv_pack [512x512] -> gemm_qkv\n      one GEMM for " + p +
                     ".attn1.to_q, " + p + ".attn1.to_k (the first called computes all)\n" +
                     "      ladder: step aside at " + p + ".attn1\n"});
  }
  EXPECT_EQ(group_entries(e),
            "  blocks.{0..2}.attn1  qkv_pack [512x512] -> gemm_qkv  x3\n"
            "      one GEMM for blocks.{0..2}.attn1.to_q, blocks.{0..2}.attn1.to_k (the first "
            "called computes all)\n"
            "      ladder: step aside at blocks.{0..2}.attn1\n");
}

TEST(ExplainGroups, AReasonNamingAnotherIndexOrANumberIsNotRewritten) {
  // Layer 1's reason names layer 2's path: the texts differ, so nothing is merged. Numbers that
  // are not path components (shapes, counts) are left as they are.
  std::vector<ExplainEntry> e;
  e.push_back(line("layers.0.mlp", "feeds layers.1.mlp; 1 rows"));
  e.push_back(line("layers.1.mlp", "feeds layers.2.mlp; 1 rows"));
  EXPECT_EQ(group_entries(e), e[0].text + e[1].text);
  // The same number written as part of another name is not the index either.
  e = {line("layers.0.mlp", "see xlayers.0 and model.layers.0 and layers.0x"),
       line("layers.1.mlp", "see xlayers.0 and model.layers.0 and layers.0x")};
  EXPECT_EQ(group_entries(e),
            "  layers.{0..1}.mlp  see xlayers.0 and model.layers.0 and layers.0x  x2\n");
}

TEST(ExplainGroups, NestedIndicesGroupAlongTheOutermostIndexThatDiffers) {
  // A grid blocks.{0..3}.attn.{0..1}: grouped along the outer index, one line per inner index.
  std::vector<ExplainEntry> grid;
  for (int b = 0; b < 4; ++b)
    for (int a = 0; a < 2; ++a)
      grid.push_back(line("blocks." + std::to_string(b) + ".attn." + std::to_string(a), "seated"));
  EXPECT_EQ(group_entries(grid),
            "  blocks.{0..3}.attn.0  seated  x4\n  blocks.{0..3}.attn.1  seated  x4\n");
  // Only the inner index varies: grouped along it, the outer index written as it is.
  const std::vector<ExplainEntry> inner = {line("down.1.attn.0", "seated"),
                                           line("down.1.attn.1", "seated"),
                                           line("down.1.attn.2", "seated"), line("up", "seated")};
  EXPECT_EQ(group_entries(inner), "  down.1.attn.{0..2}  seated  x3\n  up  seated\n");
}

TEST(ExplainGroups, RepeatedEntriesKeepTheirCount) {
  // The same index twice is a second group, never "{0..1} x3": every entry is counted once.
  std::vector<ExplainEntry> e = layers({0, 1, 0, 1, 0}, "refused");
  EXPECT_EQ(group_entries(e),
            "  model.layers.{0..1}.mlp  refused  x2\n"
            "  model.layers.{0..1}.mlp  refused  x2\n"
            "  model.layers.0.mlp  refused\n");
}

TEST(ExplainGroups, APathStartingWithAnIndexGroupsWithItsNextComponent) {
  // An nn.Sequential's children: the bare number alone is never taken for the path.
  const std::vector<ExplainEntry> e = {line("0.proj", "1 rows, 0 of 2"),
                                       line("1.proj", "1 rows, 0 of 2"),
                                       line("2.proj", "1 rows, 0 of 2")};
  EXPECT_EQ(group_entries(e), "  {0..2}.proj  1 rows, 0 of 2  x3\n");
  // Leading zeros make a name, not an index; an empty site is never grouped.
  const std::vector<ExplainEntry> names = {
      line("l.01", "x"), line("l.02", "x"), {"", "  (host)\n"}, {"", "  (host)\n"}};
  EXPECT_EQ(group_entries(names), "  l.01  x\n  l.02  x\n  (host)\n  (host)\n");
}

TEST(ExplainGroups, GroupsComeInTheOrderOfTheirFirstMember) {
  std::vector<ExplainEntry> e;
  for (int i = 0; i < 3; ++i) {
    const std::string p = "layers." + std::to_string(i);
    e.push_back(line(p + ".attn.q_proj", "linear_proj -> linear_w8g64a16"));
    e.push_back(line(p + ".mlp", "decoder_ffn -> ffn_w8g64a16"));
  }
  e.push_back(line("head", "lm_head -> linear_w8g64a16"));
  EXPECT_EQ(group_entries(e),
            "  layers.{0..2}.attn.q_proj  linear_proj -> linear_w8g64a16  x3\n"
            "  layers.{0..2}.mlp  decoder_ffn -> ffn_w8g64a16  x3\n"
            "  head  lm_head -> linear_w8g64a16\n");
}

}  // namespace
}  // namespace frt::detail

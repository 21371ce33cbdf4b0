#include <flashrt/errors.h>
#include <flashrt/gates.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace frt {
namespace {

// The shipped catalog's parity bands (gates.yaml): values pass 0.999 / warn 0.995,
// distributions pass 0.95 / warn 0.85.
const Catalog& catalog() {
  static const Catalog c = Catalog::load(FRT_TEST_CATALOG_DIR);
  return c;
}

TensorView vec(std::vector<float>& v, int64_t rows, int64_t cols) {
  return TensorView::matrix(v.data(), DType::f32, rows, cols, cols);
}

TEST(Gates, ValueMetricsAndBands) {
  std::vector<float> a = {1, 2, 3, 4}, b = {1, 2, 3, 4.01f};
  const ValueMetrics m = value_metrics(vec(a, 1, 4), vec(b, 1, 4));
  EXPECT_GT(m.cosine, 0.9999);
  EXPECT_NEAR(m.max_abs, 0.01, 1e-6);
  const OutputBand& values = catalog().band(OutputKind::values);
  EXPECT_EQ(values.metric, "cosine");
  EXPECT_STREQ(band_name(parity_band(values, 0.9995)), "pass");
  EXPECT_STREQ(band_name(parity_band(values, 0.999)), "pass");  // the bounds are inclusive
  EXPECT_STREQ(band_name(parity_band(values, 0.996)), "warn");
  EXPECT_STREQ(band_name(parity_band(values, 0.995)), "warn");
  EXPECT_STREQ(band_name(parity_band(values, 0.99)), "low");
  std::vector<float> nan = {1, NAN, 3, 4};
  EXPECT_TRUE(std::isnan(value_metrics(vec(nan, 1, 4), vec(a, 1, 4)).cosine));
  EXPECT_STREQ(band_name(parity_band(values, NAN)), "low");
}

TEST(Gates, DistributionMetricsCountTop1PerPosition) {
  std::vector<float> got = {0, 1, 0, /**/ 5, 0, 0, /**/ 0, 0, 1};
  std::vector<float> want = {0, 2, 0, /**/ 0, 5, 0, /**/ 0, 0, 3};
  const DistributionMetrics m = distribution_metrics(vec(got, 3, 3), vec(want, 3, 3));
  EXPECT_EQ(m.positions, 3);
  EXPECT_NEAR(m.top1_agreement, 2.0 / 3, 1e-12);
  const OutputBand& dist = catalog().band(OutputKind::distribution);
  EXPECT_EQ(dist.metric, "top1_agreement");
  EXPECT_STREQ(band_name(parity_band(dist, 0.96)), "pass");
  EXPECT_STREQ(band_name(parity_band(dist, 0.9)), "warn");
  EXPECT_STREQ(band_name(parity_band(dist, m.top1_agreement)), "low");
  EXPECT_STREQ(band_name(parity_band(dist, NAN)), "low");
}

TEST(Gates, ShapeAndLayoutMismatchesAreErrors) {
  std::vector<float> a(6), b(4);
  EXPECT_THROW(value_metrics(vec(a, 2, 3), vec(b, 2, 2)), InvalidArgument);
  TensorView t = vec(a, 2, 3);
  t.strides = {1, 2, 0, 0};
  EXPECT_THROW(value_metrics(t, vec(a, 2, 3)), InvalidArgument);
}

TEST(Gates, LatencyVerdictUsesTheMedianRoundRatio) {
  const LatencyVerdict v = latency_verdict({10, 10, 10, 10, 10}, {9, 9.9, 10.5, 9.5, 9.7}, 1.02);
  EXPECT_NEAR(v.median_ratio, 10 / 9.7, 1e-12);
  EXPECT_TRUE(v.activates);
  EXPECT_FALSE(latency_verdict({10}, {9.9}, 1.02).activates);
  EXPECT_THROW(latency_verdict({1, 2}, {1}, 1.02), InvalidArgument);
}

TEST(Gates, FloorsAndCeilings) {
  const std::map<std::string, double> m = {{"cosine", 0.998}, {"max_abs", 0.2}};
  EXPECT_EQ(floors_shortfall(m, {{"cosine", 0.99}, {"max_abs", 0.5}}), "");
  EXPECT_NE(floors_shortfall(m, {{"cosine", 0.999}}).find("cosine 0.998 < floor 0.999"),
            std::string::npos);
  EXPECT_NE(floors_shortfall(m, {{"max_abs", 0.1}}).find("> ceiling"), std::string::npos);
  EXPECT_THROW(floors_shortfall(m, {{"top1_agreement", 0.9}}), InvalidArgument);
}

// The gates of the structure a unit is made of: its minimum speedup (1.02) comes from here.
const GateSpec& gate() { return catalog().get("linear_proj").gate; }

// judge_unit decides in a fixed order: fallbacks, then the caller's floors, then latency.
TEST(Gates, JudgeUnitRefusesForFallbacksFirst) {
  const OutputBand& band = catalog().band(OutputKind::values);
  // Every later check would refuse too: the ledger decides first.
  const UnitVerdict v =
      judge_unit(band, gate(), {{"cosine", 0.9}, {"max_abs", 1.0}}, /*fallbacks=*/3, {1, 1, 1},
                 {2, 2, 2}, std::nullopt, {{"cosine", 0.999}});
  EXPECT_EQ(v.decision, UnitDecision::refused_fallbacks);
  EXPECT_EQ(v.text.rfind("refused: 3 fallbacks", 0), 0u) << v.text;
  EXPECT_EQ(v.band, ParityBand::low);
  EXPECT_FALSE(v.latency.activates);
}

TEST(Gates, JudgeUnitRefusesForAFloorBeforeLatency) {
  const OutputBand& band = catalog().band(OutputKind::values);
  const UnitVerdict v = judge_unit(band, gate(), {{"cosine", 0.998}, {"max_abs", 0.01}}, 0,
                                   {1, 1, 1}, {2, 2, 2}, std::nullopt, {{"cosine", 0.999}});
  EXPECT_EQ(v.decision, UnitDecision::refused_floor);
  EXPECT_EQ(v.text, "refused: cosine 0.998 < floor 0.999");
  EXPECT_EQ(v.band, ParityBand::warn);
  // A ceiling is a floor too.
  const UnitVerdict c = judge_unit(band, gate(), {{"cosine", 0.9999}, {"max_abs", 0.5}}, 0,
                                   {2, 2, 2}, {1, 1, 1}, std::nullopt, {{"max_abs", 0.1}});
  EXPECT_EQ(c.decision, UnitDecision::refused_floor);
  EXPECT_NE(c.text.find("max_abs 0.5 > ceiling 0.1"), std::string::npos) << c.text;
}

TEST(Gates, JudgeUnitRefusesASlowUnitWithTheMedianSpeedup) {
  const OutputBand& band = catalog().band(OutputKind::values);
  const UnitVerdict v =
      judge_unit(band, gate(), {{"cosine", 0.9999}, {"max_abs", 0.001}}, 0, {1.01, 1.01, 1.01},
                 {1, 1, 1}, std::nullopt, {{"cosine", 0.999}});
  EXPECT_EQ(v.decision, UnitDecision::refused_latency);
  EXPECT_EQ(v.text, "refused: median speedup 1.010x < 1.02x");
  EXPECT_EQ(v.band, ParityBand::pass);
  EXPECT_NEAR(v.latency.median_ratio, 1.01, 1e-12);
  EXPECT_FALSE(v.latency.activates);
}

TEST(Gates, TheCallersMinimumSpeedupOverridesTheStructures) {
  const OutputBand& band = catalog().band(OutputKind::values);
  const UnitVerdict v =
      judge_unit(band, gate(), {{"cosine", 0.9999}}, 0, {2, 2, 2}, {1, 1, 1}, 2.5, {});
  EXPECT_EQ(v.decision, UnitDecision::refused_latency);
  EXPECT_EQ(v.text, "refused: median speedup 2.000x < 2.5x");
  const UnitVerdict d =
      judge_unit(band, gate(), {{"cosine", 0.9999}}, 0, {2, 2, 2}, {1, 1, 1}, std::nullopt, {});
  EXPECT_EQ(d.decision, UnitDecision::activated);
}

TEST(Gates, JudgeUnitActivatesAFastUnitWithinItsFloors) {
  const OutputBand& band = catalog().band(OutputKind::distribution);
  // A warn band alone does not refuse: only floors turn a number into a refusal.
  const UnitVerdict v =
      judge_unit(band, gate(), {{"top1_agreement", 0.9}, {"last_position_cosine", 0.99}}, 0,
                 {2, 2, 2}, {1, 1, 1.5}, std::nullopt, {});
  EXPECT_EQ(v.decision, UnitDecision::activated);
  EXPECT_EQ(v.text, "activated");
  EXPECT_EQ(v.band, ParityBand::warn);
  EXPECT_TRUE(v.latency.activates);
  EXPECT_NEAR(v.latency.median_ratio, 2.0, 1e-12);
}

TEST(Gates, JudgeUnitNeedsTheBandsMetricAndMeasuredFloors) {
  const OutputBand& band = catalog().band(OutputKind::distribution);
  EXPECT_THROW(judge_unit(band, gate(), {{"cosine", 0.99}}, 0, {2}, {1}, std::nullopt, {}),
               InvalidArgument);
  EXPECT_THROW(judge_unit(catalog().band(OutputKind::values), gate(), {{"cosine", 0.9999}}, 0, {2},
                          {1}, std::nullopt, {{"top1_agreement", 0.9}}),
               InvalidArgument);
}

// Note [Gated auto]: the fastest candidate that is activated and in the pass band; a faster one
// in the warn band, or refused, is passed over; none such: -1.
TEST(Gates, PickCandidateTakesTheFastestActivatedInThePassBand) {
  const OutputBand& band = catalog().band(OutputKind::distribution);
  auto verdict = [&](double top1, double speedup, int64_t fallbacks = 0) {
    return judge_unit(band, gate(), {{"top1_agreement", top1}}, fallbacks, {speedup}, {1.0}, 1.0,
                      {});
  };
  const UnitVerdict weight_only = verdict(0.99, 1.10), integer_acts = verdict(0.97, 1.40),
                    fast_but_warn = verdict(0.90, 1.90), slow = verdict(0.99, 0.80),
                    fell_back = verdict(0.99, 2.50, 1);
  EXPECT_EQ(fast_but_warn.decision, UnitDecision::activated);  // an explicit choice would keep it
  EXPECT_EQ(pick_candidate({weight_only, integer_acts, fast_but_warn}), 1);
  EXPECT_EQ(pick_candidate({fell_back, slow, weight_only}), 2);
  EXPECT_EQ(pick_candidate({fast_but_warn, slow, fell_back}), -1);
  EXPECT_EQ(pick_candidate({}), -1);
}

// Note [Unit arbitration].
UnitVerdict verdict_of(UnitDecision d, ParityBand band, double speedup,
                       const std::string& text = "activated") {
  UnitVerdict v;
  v.decision = d;
  v.band = band;
  v.text = text;
  v.latency.median_ratio = speedup;
  v.latency.activates = d == UnitDecision::activated;
  return v;
}

CandidateResult candidate(const std::string& scheme, std::optional<UnitVerdict> v,
                          std::vector<std::string> paths, const std::string& unmeasured = "") {
  return CandidateResult{scheme, std::move(v), unmeasured, std::move(paths), {}};
}

TEST(Arbiter, GatedAutoKeepsTheFastestPassingCandidatePerUnit) {
  UnitArbiter a(/*gated_auto=*/true);
  const auto ok = [](double s) { return verdict_of(UnitDecision::activated, ParityBand::pass, s); };
  EXPECT_TRUE(a.offer("decoder_ffn", candidate("w8", ok(1.2), {"m.0.mlp", "m.1.mlp"})));
  EXPECT_FALSE(a.offer("lm_head", candidate("w8", std::nullopt, {"lm_head"},
                                            "refused: the seat gave its region back")));
  EXPECT_TRUE(a.offer("decoder_ffn", candidate("w4a8", ok(1.5), {"m.0.mlp", "m.1.mlp"})));
  // Faster but in the warn band, and slower but passing: neither replaces the best.
  EXPECT_FALSE(a.offer(
      "decoder_ffn",
      candidate("fast", verdict_of(UnitDecision::activated, ParityBand::warn, 3.0), {"m.0.mlp"})));
  EXPECT_FALSE(a.offer("decoder_ffn", candidate("slow", ok(1.1), {"m.0.mlp"})));
  EXPECT_TRUE(a.offer("lm_head", candidate("w4a8", ok(1.3), {"lm_head"})));
  a.plan_refused("w8", "m.0.attn", "no form");
  a.plan_refused("w4a8", "m.0.attn", "no form either");
  a.plan_refused("w8", "m.0.mlp", "decided by the unit, not by this");
  const Arbitration r = a.settle();
  ASSERT_EQ(r.units.size(), 2u);
  EXPECT_EQ(r.units[0].unit, "decoder_ffn");
  EXPECT_EQ(r.units[0].scheme, "w4a8");
  EXPECT_TRUE(r.units[0].kept());
  EXPECT_EQ(r.units[0].paths, (std::vector<std::string>{"m.0.mlp", "m.1.mlp"}));
  EXPECT_EQ(r.units[1].scheme, "w4a8");
  ASSERT_EQ(r.refused.size(), 1u);  // a seated module's plan refusal is moot
  EXPECT_EQ(r.refused[0].first, "m.0.attn");
  EXPECT_EQ(r.refused[0].second, "w8: no form; w4a8: no form either");
}

TEST(Arbiter, AUnitWithNoPassingCandidateRefusesEveryModuleAnyCandidateSeats) {
  UnitArbiter a(/*gated_auto=*/true);
  a.offer("decoder_ffn", candidate("w8",
                                   verdict_of(UnitDecision::refused_latency, ParityBand::pass, 0.9,
                                              "refused: median speedup 0.900x < 1.05x"),
                                   {"m.1.mlp", "m.0.mlp"}));
  a.offer("decoder_ffn",
          candidate("w4", std::nullopt, {"m.2.mlp"}, "refused: the seat gave its region back"));
  const Arbitration r = a.settle();
  ASSERT_EQ(r.units.size(), 1u);
  EXPECT_FALSE(r.units[0].kept());
  EXPECT_EQ(r.units[0].best, "");
  EXPECT_EQ(r.units[0].decision,
            "refused: no candidate passed (w8: refused: median speedup 0.900x < 1.05x, parity "
            "pass; w4: refused: the seat gave its region back, parity unmeasured)");
  ASSERT_EQ(r.refused.size(), 3u);
  EXPECT_EQ(r.refused[0].first, "m.0.mlp");  // sorted
  EXPECT_EQ(r.refused[2].first, "m.2.mlp");
  EXPECT_EQ(r.refused[0].second, "decoder_ffn unit " + r.units[0].decision);
}

TEST(Arbiter, AUnitRunningOtherUnitsSeatsIsKeptOnlyWithThemUnderItsScheme) {
  const UnitVerdict ok = verdict_of(UnitDecision::activated, ParityBand::pass, 1.5);
  const UnitVerdict slow =
      verdict_of(UnitDecision::refused_latency, ParityBand::pass, 0.9, "refused: 0.9x");
  const auto block = [&](const char* scheme) {
    CandidateResult c = candidate(scheme, ok, {"m.0:decoder_block"});
    c.needs = {"m.0.mlp", "m.0.input_layernorm"};
    return c;
  };
  {  // every part kept under the block's scheme: kept
    UnitArbiter a(/*gated_auto=*/false);
    a.offer("decoder_ffn", candidate("w8", ok, {"m.0.mlp"}));
    a.offer("norm_fused", candidate("w8", ok, {"m.0.input_layernorm"}));
    a.offer("decoder_block", block("w8"));
    EXPECT_TRUE(a.settle().units[2].kept());
  }
  {  // a part's unit refused: so is the block, naming it
    UnitArbiter a(/*gated_auto=*/false);
    a.offer("decoder_ffn", candidate("w8", ok, {"m.0.mlp"}));
    a.offer("norm_fused", candidate("w8", slow, {"m.0.input_layernorm"}));
    a.offer("decoder_block", block("w8"));
    const Arbitration r = a.settle();
    EXPECT_FALSE(r.units[2].kept());
    EXPECT_EQ(r.units[2].decision,
              "refused: the seats it runs are not all kept under w8 (m.0.input_layernorm)");
  }
  {  // gated auto: the parts kept under another scheme than the block's best
    UnitArbiter a(/*gated_auto=*/true);
    a.offer("decoder_ffn", candidate("w4", ok, {"m.0.mlp"}));
    a.offer("norm_fused", candidate("w4", ok, {"m.0.input_layernorm"}));
    a.offer("decoder_block", block("w8"));
    EXPECT_FALSE(a.settle().units[2].kept());
  }
}

TEST(Arbiter, AUnitWhoseModulesAnotherKeptUnitHoldsIsRefused) {
  UnitArbiter a(/*gated_auto=*/false);
  const UnitVerdict ok = verdict_of(UnitDecision::activated, ParityBand::warn, 1.2);
  EXPECT_TRUE(a.offer("decoder_ffn", candidate("w8", ok, {"m.0.mlp"})));
  EXPECT_TRUE(a.offer("linear_proj", candidate("w8", ok, {"m.0.mlp.down_proj", "m.0.attn.q"})));
  EXPECT_FALSE(a.offer("other", candidate("w8",
                                          verdict_of(UnitDecision::refused_floor, ParityBand::low,
                                                     2.0, "refused: cosine 0.9 < floor 0.99"),
                                          {"m.1.x"})));
  a.plan_refused("w8", "m.9", "named scheme: no prefix");
  const Arbitration r = a.settle();
  ASSERT_EQ(r.units.size(), 3u);
  EXPECT_TRUE(r.units[0].kept());  // a named scheme keeps a warn band
  EXPECT_FALSE(r.units[1].kept());
  EXPECT_EQ(r.units[1].decision, "refused: its modules are seated by another unit");
  EXPECT_EQ(r.units[1].best, "w8");  // what it would have kept
  EXPECT_EQ(r.units[2].best, "");
  EXPECT_EQ(r.units[2].decision, "refused: cosine 0.9 < floor 0.99");
  ASSERT_EQ(r.refused.size(), 4u);
  EXPECT_EQ(r.refused[0],
            (std::pair<std::string, std::string>{
                "m.0.attn.q", "linear_proj unit refused: its modules are seated by another unit"}));
  EXPECT_EQ(r.refused[3], (std::pair<std::string, std::string>{"m.9", "named scheme: no prefix"}));
}

TEST(Arbiter, OverlapIsAncestryNotAPrefixOfTheName) {
  EXPECT_TRUE(overlaps("a.b", {"a.b"}));
  EXPECT_TRUE(overlaps("a.b.c", {"a.b"}));
  EXPECT_TRUE(overlaps("a", {"a.b"}));
  EXPECT_FALSE(overlaps("a.bc", {"a.b"}));
  EXPECT_FALSE(overlaps("a.b", {"a.bc", "x"}));
  EXPECT_FALSE(overlaps("a.b", {}));
}

TEST(SelfCheck, EveryFloorIsJudgedAndTheFirstShortfallNamed) {
  const SelfCheckSpec& spec = catalog().decode_self_check();
  std::vector<float> want = {1, 0, 0, 0, 2, 0, 0, 0, 3, 1, 1, 1};  // 3 positions x 4
  std::vector<float> same = want;
  // Keys of 2 layers x 3 positions, width 2 (layer major).
  std::vector<float> keys = {1, 0, 0, 1, 1, 1, 2, 0, 0, 2, 1, -1};
  std::vector<float> keys_same = keys;
  const auto judge = [&](std::vector<float>& got, std::vector<float>& got_keys) {
    return judge_self_check(spec, vec(got, 3, 4), vec(want, 3, 4), vec(got_keys, 6, 2),
                            vec(keys, 6, 2));
  };
  SelfCheckVerdict v = judge(same, keys_same);
  EXPECT_TRUE(v.passed);
  EXPECT_EQ(v.text, "passed");
  EXPECT_DOUBLE_EQ(v.top1_agreement, 1.0);
  EXPECT_NEAR(v.min_cosine, 1.0, 1e-12);
  EXPECT_NEAR(v.min_keys_cosine, 1.0, 1e-12);
  // Every argmax agrees, the last position's values do not: refused by the values.
  std::vector<float> skew = {1, 0, 0, 0, 2, 0, 0, 0, 3, 2.5f, 0, 0};
  v = judge(skew, keys_same);
  EXPECT_FALSE(v.passed);
  EXPECT_DOUBLE_EQ(v.top1_agreement, 1.0);
  EXPECT_EQ(v.worst_position, 2);
  EXPECT_NE(v.text.find("teacher-forced logits cosine 0.8"), std::string::npos) << v.text;
  EXPECT_NE(v.text.find("at position 2 of a 3-token probe (< 0.999)"), std::string::npos);
  // Argmaxes moved on two of three positions: refused by the agreement, named first.
  std::vector<float> moved = {0, 1, 0, 0, 0, 2, 0, 0, 3, 1, 1, 1};
  v = judge(moved, keys_same);
  EXPECT_FALSE(v.passed);
  EXPECT_EQ(v.text,
            "self-check against the host: teacher-forced agreement 0.33 on a 3-token probe "
            "(< 0.75); this stack computes something the loop does not");
  // Logits identical, the second layer's key at position 2 rotated the other way: refused by
  // the keys (a wrong rotary pairing reads like this).
  std::vector<float> rotated = keys;
  rotated[10] = 1;
  rotated[11] = 1;
  v = judge(same, rotated);
  EXPECT_FALSE(v.passed);
  EXPECT_EQ(v.worst_key_layer, 1);
  EXPECT_EQ(v.worst_key_position, 2);
  EXPECT_NEAR(v.min_keys_cosine, 0.0, 1e-12);
  EXPECT_NE(v.text.find("the keys cached at layer 1, position 2 have cosine 0.000000 with the "
                        "host's (< 0.99) on a 3-token probe"),
            std::string::npos)
      << v.text;
  std::vector<float> nan = want;
  nan[1] = NAN;
  v = judge(nan, keys_same);
  EXPECT_FALSE(v.passed);
  EXPECT_TRUE(std::isnan(v.min_cosine));
  EXPECT_EQ(v.worst_position, 0);
  EXPECT_THROW(judge_self_check(spec, vec(same, 2, 6), vec(want, 3, 4), vec(keys_same, 6, 2),
                                vec(keys, 6, 2)),
               InvalidArgument);
  EXPECT_THROW(judge_self_check(spec, vec(same, 1, 12), vec(want, 3, 4), vec(keys_same, 6, 2),
                                vec(keys, 6, 2)),
               InvalidArgument);
  // Keys whose rows are not a whole number of layers of the probe's positions.
  EXPECT_THROW(judge_self_check(spec, vec(same, 3, 4), vec(want, 3, 4), vec(keys_same, 4, 3),
                                vec(keys, 4, 3)),
               InvalidArgument);
}

TEST(SelfCheck, CertificationTakesTheWorstSample) {
  CertificationVerdict v = judge_certification({0.9999, 0.99995}, 0.999);
  EXPECT_TRUE(v.passed);
  EXPECT_DOUBLE_EQ(v.worst_cosine, 0.9999);
  EXPECT_EQ(v.samples, 2);
  v = judge_certification({0.9999, 0.5, 0.9999}, 0.999);
  EXPECT_FALSE(v.passed);
  EXPECT_EQ(v.text, "worst cosine 0.500000 < gate 0.999");
  EXPECT_TRUE(judge_certification({0.5}, 0).passed);  // no floor: figures only
  EXPECT_FALSE(judge_certification({0.9999, NAN, 0.9999}, 0.999).passed);
  EXPECT_THROW(judge_certification({}, 0.999), InvalidArgument);
}

}  // namespace
}  // namespace frt

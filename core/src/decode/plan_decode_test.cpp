// The decode plan's explain(): its refusals and assumptions grouped by index like a Plan's
// (Note [Explain groups]), verbose listing each; and the planning of routed layers (Note [Routed
// layers]) on HostGraphs written here. The plan is tested on real hosts by the door's tests
// (python/tests/test_decode.py, test_decode_moe.py).
#include <flashrt/catalog.h>
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

// A two-layer Llama-style stack (hidden 64, 4 heads of 16, vocab 100) whose layers are dense or
// routed (8 experts of width 32, top-2, a shared expert where asked), as the door describes one.
constexpr int64_t kHidden = 64, kExperts = 8, kInner = 32;

HostModule module(const std::string& path, ModuleKind kind, int64_t in = 0, int64_t out = 0) {
  HostModule m;
  m.path = path;
  m.kind = kind;
  m.type_name = "T";
  m.in_features = in;
  m.out_features = out;
  return m;
}

HostModule norm(const std::string& path, int64_t width) {
  HostModule m = module(path, ModuleKind::norm, width, width);
  m.norm.form = NormForm::rms;
  m.norm.eps = 1e-6;
  return m;
}

void dense_ffn(HostGraph& g, const std::string& at, int64_t inner) {
  g.modules.push_back(module(at + ".gate_proj", ModuleKind::linear, kHidden, inner));
  g.modules.push_back(module(at + ".up_proj", ModuleKind::linear, kHidden, inner));
  g.modules.push_back(module(at + ".down_proj", ModuleKind::linear, inner, kHidden));
  HostModule act = module(at + ".act_fn", ModuleKind::activation);
  act.activation = Activation::silu;
  g.modules.push_back(act);
}

enum class Ffn { dense, routed, shared };

HostGraph stack(const std::vector<Ffn>& layers, RouterForm form = RouterForm::softmax_topk) {
  HostGraph g;
  g.config.heads = 4;
  g.config.kv_heads = 2;
  g.config.head_dim = 16;
  g.config.intermediate = 128;
  g.input_embedding = "model.embed_tokens";
  g.output_head = "lm_head";
  g.modules.push_back(module("model.embed_tokens", ModuleKind::embedding, 100, kHidden));
  g.modules.push_back(module("lm_head", ModuleKind::linear, kHidden, 100));
  g.modules.push_back(norm("model.norm", kHidden));
  HostModule rotary = module("model.rotary_emb", ModuleKind::module);
  rotary.rotary.inv_freq.assign(8, 0.5f);
  g.modules.push_back(rotary);
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string at = "model.layers." + std::to_string(i);
    g.modules.push_back(module(at, ModuleKind::module));
    g.modules.push_back(norm(at + ".input_layernorm", kHidden));
    g.modules.push_back(norm(at + ".post_attention_layernorm", kHidden));
    for (const char* p : {"q_proj", "o_proj"})
      g.modules.push_back(module(at + ".self_attn." + p, ModuleKind::linear, kHidden, kHidden));
    for (const char* p : {"k_proj", "v_proj"})
      g.modules.push_back(module(at + ".self_attn." + p, ModuleKind::linear, kHidden, 32));
    const std::string mlp = at + ".mlp";
    HostModule block = module(mlp, ModuleKind::module);
    if (layers[i] == Ffn::dense) {
      g.modules.push_back(block);
      dense_ffn(g, mlp, 128);
      continue;
    }
    block.children = {mlp + ".gate", mlp + ".experts"};
    HostModule bank = module(mlp + ".experts", ModuleKind::experts, kHidden, kHidden);
    bank.experts.experts = kExperts;
    bank.experts.hidden = kHidden;
    bank.experts.intermediate = kInner;
    bank.experts.gate_up = "gate_up_proj";
    bank.experts.down = "down_proj";
    bank.experts.router = mlp + ".gate";
    bank.activation = Activation::silu;
    HostModule router = module(mlp + ".gate", ModuleKind::module);
    router.router.form = form;
    router.router.experts = kExperts;
    router.router.hidden = kHidden;
    router.router.top_k = 2;
    router.router.other = form == RouterForm::other ? "sigmoid scores" : "";
    g.params.push_back({mlp + ".gate", "weight", {kExperts, kHidden}, kExperts * kHidden});
    g.params.push_back({mlp + ".experts", "gate_up_proj", {kExperts, 2 * kInner, kHidden}, 0});
    if (layers[i] == Ffn::shared) {
      block.children.push_back(mlp + ".shared_expert");
      block.children.push_back(mlp + ".shared_expert_gate");
      g.modules.push_back(module(mlp + ".shared_expert", ModuleKind::module));
      dense_ffn(g, mlp + ".shared_expert", 48);
      g.modules.push_back(module(mlp + ".shared_expert_gate", ModuleKind::linear, kHidden, 1));
    }
    g.modules.push_back(block);
    g.modules.push_back(bank);
    g.modules.push_back(router);
  }
  return g;
}

const Catalog& shipped() {
  static const Catalog c = Catalog::load(FRT_TEST_CATALOG_DIR);
  return c;
}

DecodePlan plan_of(const HostGraph& g) { return plan_decode(g, shipped(), "llama_decode", 32); }

TEST(DecodePlanRouted, EachLayerIsDenseOrRoutedByWhatItHolds) {
  const DecodePlan p = plan_of(stack({Ffn::dense, Ffn::routed}, RouterForm::softmax_topk));
  ASSERT_TRUE(p.ok()) << explain(p);
  ASSERT_EQ(p.layers.size(), 2u);
  EXPECT_FALSE(p.layers[0].routed);
  EXPECT_EQ(p.layers[0].activation, Activation::silu);
  const DecodeLayerPlan& r = p.layers[1];
  EXPECT_TRUE(r.routed);
  EXPECT_EQ(r.slots.at("router"), "model.layers.1.mlp.gate");
  EXPECT_EQ(r.moe.experts, kExperts);
  EXPECT_EQ(r.moe.intermediate, kInner);
  EXPECT_EQ(r.moe.top_k, 2);
  EXPECT_FALSE(r.moe.renormalise);
  EXPECT_FALSE(r.moe.bank_seated);
  EXPECT_FALSE(r.moe.shared);
  EXPECT_NE(explain(p).find("\nrouted:\n  model.layers.1.mlp  8 experts (silu), top-2 of softmax, "
                            "bank at host precision\n"),
            std::string::npos)
      << explain(p);
}

TEST(DecodePlanRouted, TheRouterFormIsWhatTheDoorMeasured) {
  const DecodePlan renorm = plan_of(stack({Ffn::routed}, RouterForm::softmax_topk_renormalised));
  ASSERT_TRUE(renorm.ok()) << explain(renorm);
  EXPECT_TRUE(renorm.layers[0].moe.renormalise);
  const DecodePlan other = plan_of(stack({Ffn::routed}, RouterForm::other));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.refused[0].first, "model.layers.0.mlp.gate");
  EXPECT_EQ(other.refused[0].second,
            "model.layers.0.mlp.gate (T) does not route as the top-k of softmax(x W^T): sigmoid "
            "scores");
  const DecodePlan unmeasured = plan_of(stack({Ffn::routed}, RouterForm::unknown));
  ASSERT_FALSE(unmeasured.ok());
  EXPECT_NE(unmeasured.refused[0].second.find("the door measured no routing"), std::string::npos);
}

TEST(DecodePlanRouted, ASharedExpertIsPlannedWithItsGateAndTheMixIsAnAssumption) {
  const DecodePlan p = plan_of(stack({Ffn::shared}));
  ASSERT_TRUE(p.ok()) << explain(p);
  const DecodeMoePlan& m = p.layers[0].moe;
  EXPECT_TRUE(m.shared);
  EXPECT_EQ(m.shared_intermediate, 48);
  EXPECT_EQ(m.shared_activation, Activation::silu);
  ASSERT_EQ(p.assumed.size(), 1u);
  EXPECT_NE(p.assumed[0].find("sigmoid(model.layers.0.mlp.shared_expert_gate x)"),
            std::string::npos);
}

TEST(DecodePlanRouted, BankAndRouterAreBothJudged) {
  HostGraph g = stack({Ffn::routed}, RouterForm::other);
  for (HostModule& m : g.modules)
    if (m.path == "model.layers.0.mlp.experts") {
      m.experts.transposed = true;
      m.experts.has_bias = true;
    }
  const DecodePlan p = plan_of(g);
  ASSERT_EQ(p.refused.size(), 2u) << explain(p);
  EXPECT_EQ(p.refused[0].first, "model.layers.0.mlp.experts");
  EXPECT_NE(p.refused[0].second.find("transposed [experts, in, out] with per-expert biases"),
            std::string::npos);
  EXPECT_EQ(p.refused[1].first, "model.layers.0.mlp.gate");
}

TEST(DecodePlanRouted, ARouterOutsideTheBindingsSlotIsNamedWithWhatItComputes) {
  HostGraph g = stack({Ffn::routed}, RouterForm::other);
  for (HostModule& m : g.modules) {
    if (m.path == "model.layers.0.mlp.gate") m.path = "model.layers.0.mlp.router";
    if (m.path == "model.layers.0.mlp.experts") m.experts.router = "model.layers.0.mlp.router";
  }
  for (HostParam& hp : g.params)
    if (hp.module == "model.layers.0.mlp.gate") hp.module = "model.layers.0.mlp.router";
  const DecodePlan p = plan_of(g);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.refused[0].second,
            "a required slot is absent on this host: model.layers.0.mlp.gate; the bank's routing "
            "weight is held by model.layers.0.mlp.router; model.layers.0.mlp.router (T) does not "
            "route as the top-k of softmax(x W^T): sigmoid scores");
}

TEST(DecodePlanRouted, AWeightInTheBlockOutsideTheSlotsIsRefused) {
  HostGraph g = stack({Ffn::routed});
  for (HostModule& m : g.modules)
    if (m.path == "model.layers.0.mlp") m.children.push_back("model.layers.0.mlp.shared_experts");
  g.modules.push_back(module("model.layers.0.mlp.shared_experts", ModuleKind::module));
  g.params.push_back({"model.layers.0.mlp.shared_experts.up_proj", "weight", {96, 64}, 96 * 64});
  const DecodePlan p = plan_of(g);
  ASSERT_FALSE(p.ok());
  // Llama's binding does not describe this layer (Note [Every weight is a slot]).
  EXPECT_FALSE(p.fits);
  EXPECT_EQ(p.refused[0].second,
            "model.layers.0.mlp.shared_experts.up_proj.weight [96, 64] is part of "
            "model.layers.0 and no slot the loop computes");
}

TEST(DecodePlanRouted, ABankWhoseGatedFormWasNotReproducedIsRefused) {
  HostGraph g = stack({Ffn::routed});
  for (HostModule& m : g.modules)
    if (m.path == "model.layers.0.mlp.experts") m.activation = Activation::unknown;
  const DecodePlan p = plan_of(g);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.refused[0].second.find("none of {silu, gelu_tanh} reproduced its call"),
            std::string::npos)
      << p.refused[0].second;
}

}  // namespace
}  // namespace frt

namespace frt {
namespace {

// Note [Choosing a binding]: the same two-layer stack with its norms placed as each family
// places them is planned under the binding that describes it, and under no other.
HostGraph with_norms(const std::vector<std::string>& add, const std::vector<std::string>& drop,
                     NormForm form) {
  HostGraph g = stack({Ffn::dense, Ffn::dense});
  std::vector<HostModule> kept;
  for (HostModule& m : g.modules) {
    bool dropped = false;
    for (const std::string& d : drop) dropped |= m.path.size() > d.size() && m.path.ends_with(d);
    if (m.kind == ModuleKind::norm) m.norm.form = form;
    if (!dropped) kept.push_back(m);
  }
  g.modules = kept;
  for (int i : {0, 1})
    for (const std::string& a : add) {
      HostModule n = norm("model.layers." + std::to_string(i) + "." + a, kHidden);
      n.norm.form = form;
      g.modules.push_back(n);
    }
  return g;
}

DecodePlan chosen(const HostGraph& g) { return plan_decode(g, shipped(), "", 32); }

TEST(DecodePlanBinding, EachNormPlacementChoosesItsFamilysBinding) {
  const DecodePlan llama = chosen(with_norms({}, {}, NormForm::rms));
  ASSERT_TRUE(llama.ok()) << explain(llama);
  EXPECT_EQ(llama.binding, "llama_decode");
  EXPECT_TRUE(llama.fits);
  // Gemma 2/3: a norm before and after each sublayer, of the form x·(1+w).
  const DecodePlan gemma = chosen(with_norms(
      {"pre_feedforward_layernorm", "post_feedforward_layernorm"}, {}, NormForm::rms_one_plus));
  ASSERT_TRUE(gemma.ok()) << explain(gemma);
  EXPECT_EQ(gemma.binding, "gemma_decode");
  EXPECT_TRUE(gemma.config.norm_plus_one);
  EXPECT_EQ(gemma.layers[0].slots.at("ffn_in_norm"), "model.layers.0.pre_feedforward_layernorm");
  // OLMo 2: none before, one after each sublayer.
  const DecodePlan olmo =
      chosen(with_norms({"post_feedforward_layernorm"}, {".input_layernorm"}, NormForm::rms));
  ASSERT_TRUE(olmo.ok()) << explain(olmo);
  EXPECT_EQ(olmo.binding, "olmo2_decode");
  EXPECT_EQ(olmo.layers[1].slots.count("attn_in_norm"), 0u);
  EXPECT_EQ(olmo.layers[1].slots.at("attn_out_norm"), "model.layers.1.post_attention_layernorm");
  // The same placement under a binding that does not describe it: not a fit.
  const DecodePlan forced =
      plan_decode(with_norms({"post_feedforward_layernorm"}, {".input_layernorm"}, NormForm::rms),
                  shipped(), "llama_decode", 32);
  EXPECT_FALSE(forced.fits);
  EXPECT_EQ(forced.refused[0].second,
            "a required slot is absent on this host: model.layers.0.input_layernorm");
}

TEST(DecodePlanBinding, NoBindingFitsAndEachSaysWhatItFound) {
  // Llama's norms with one more after the feed-forward: Llama's binding leaves it out, Gemma's
  // and OLMo 2's miss a norm each.
  const DecodePlan p = chosen(with_norms({"post_feedforward_layernorm"}, {}, NormForm::rms));
  ASSERT_FALSE(p.ok());
  EXPECT_FALSE(p.fits);
  EXPECT_EQ(p.binding, "");
  const std::string& why = p.refused[0].second;
  EXPECT_EQ(why.rfind("no decode binding describes this host (", 0), 0u) << why;
  EXPECT_NE(why.find("llama_decode: model.layers.0.post_feedforward_layernorm (T) holds a weight "
                     "and is no slot the loop computes"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("gemma_decode: a required slot is absent on this host: "
                     "model.layers.0.pre_feedforward_layernorm"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("phi3_decode: a required slot is absent"), std::string::npos) << why;
  EXPECT_NE(explain(p).find("binding (none)"), std::string::npos);
}

TEST(DecodePlanBinding, TheFormsItReadsAreCheckedAgainstTheHost) {
  // A norm form the stack does not share, layer types and rotary tables that do not add up.
  HostGraph mixed = with_norms({}, {}, NormForm::rms);
  for (HostModule& m : mixed.modules)
    if (m.path == "model.layers.1.input_layernorm") m.norm.form = NormForm::rms_one_plus;
  const DecodePlan p = chosen(mixed);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.refused[0].second,
            "model.layers.1.input_layernorm computes 'rms_one_plus' where the stack's other "
            "norms compute 'rms'; the loop applies one form");
  HostGraph typed = with_norms({}, {}, NormForm::rms);
  typed.config.layer_types = {"full_attention"};
  EXPECT_EQ(chosen(typed).refused[0].second,
            "the configuration declares 1 layer types for 2 layers");
  typed.config.layer_types = {"sliding_attention", "full_attention"};
  EXPECT_EQ(chosen(typed).refused[0].second,
            "model.layers.0 is a sliding-window layer without a declared window");
  typed.config.sliding_window = 4;
  const DecodePlan windowed = chosen(typed);
  ASSERT_TRUE(windowed.ok()) << explain(windowed);
  EXPECT_EQ(windowed.config.layer[0].window, 4);
  EXPECT_EQ(windowed.config.layer[1].window, 0);
  HostGraph wide = with_norms({}, {}, NormForm::rms);
  for (HostModule& m : wide.modules)
    if (m.path == "model.rotary_emb") m.rotary.inv_freq.assign(9, 0.5f);  // 18 dims of 16
  EXPECT_EQ(chosen(wide).refused[0].second, "model.rotary_emb rotates 18 dims of a 16-dim head");
}

}  // namespace
}  // namespace frt

namespace frt {
namespace {

TEST(DecodePlanBinding, NormsOfDifferentEpsilonsAreRefused) {
  HostGraph g = with_norms({}, {}, NormForm::rms);
  for (HostModule& m : g.modules)
    if (m.path == "model.layers.1.post_attention_layernorm") m.norm.eps = 1e-5;
  const DecodePlan p = chosen(g);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.refused[0].second,
            "model.layers.1.post_attention_layernorm has epsilon 1e-05 where the stack's other "
            "norms have 1e-06; the loop applies one");
  const DecodePlan window = plan_decode(with_norms({}, {}, NormForm::rms), shipped(), "", 0);
  EXPECT_EQ(window.refused[0].second, "a static window of 0 positions");
  const DecodePlan batch = plan_decode(with_norms({}, {}, NormForm::rms), shipped(), "", 32, 17);
  EXPECT_EQ(batch.refused[0].second,
            "a batch of 17 sequences; the loop runs 1..16 (the kernels' "
            "row band)");
}

}  // namespace
}  // namespace frt

namespace frt {
namespace {

// Note [KV cache dtype]: the plan carries the cache dtype the door asked for, explain names a
// cache other than f32, and a dtype the loop does not keep is a refusal naming it.
TEST(DecodePlanCache, TheKvCacheDtypeIsPlannedOrRefusedByName) {
  const HostGraph g = with_norms({}, {}, NormForm::rms);
  const DecodePlan f32 = plan_decode(g, shipped(), "", 32);
  ASSERT_TRUE(f32.ok()) << explain(f32);
  EXPECT_EQ(f32.config.cache_dtype, DType::f32);
  EXPECT_EQ(explain(f32).find("KV cache"), std::string::npos);
  const DecodePlan bf16 = plan_decode(g, shipped(), "", 32, 2, "bf16");
  ASSERT_TRUE(bf16.ok()) << explain(bf16);
  EXPECT_EQ(bf16.config.cache_dtype, DType::bf16);
  EXPECT_EQ(bf16.config.sequences, 2);
  EXPECT_NE(explain(bf16).find("x 2 sequences, bf16 KV cache, "), std::string::npos)
      << explain(bf16);
  for (const char* other : {"f16", "i8", "float32", ""}) {
    const DecodePlan p = plan_decode(g, shipped(), "llama_decode", 32, 1, other);
    ASSERT_FALSE(p.ok()) << other;
    EXPECT_EQ(p.refused[0].second,
              std::string("a KV cache of '") + other + "'; the loop keeps f32 or bf16");
  }
}

}  // namespace
}  // namespace frt

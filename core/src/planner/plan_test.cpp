// The planner on hand-built HostGraphs: discovery by shapes and dataflow (never names), the
// refusals a recognised-but-out-of-boundary pattern gets, schemes, keep-at-host and ladders.
// The door tests run the same planner on real transformers hosts.
#include <flashrt/errors.h>
#include <flashrt/plan.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace frt {
namespace {

const Catalog& catalog() {
  static const Catalog c = Catalog::load(FRT_TEST_CATALOG_DIR);
  return c;
}

// The shipped catalog may gain structures; every test names the ones it counts.
const std::vector<std::string> kDecoderStructures = {"linear_proj", "decoder_ffn", "lm_head"};

struct GraphBuilder {
  HostGraph g;
  int64_t next_id = 1;

  HostModule& module(const std::string& path, ModuleKind kind) {
    HostModule m;
    m.path = path;
    m.kind = kind;
    m.type_name = "Opaque";  // discovery must not care
    g.modules.push_back(m);
    if (auto dot = path.rfind('.'); dot != std::string::npos) {
      for (HostModule& parent : g.modules)
        if (parent.path == path.substr(0, dot)) parent.children.push_back(path);
    } else if (!path.empty()) {
      g.modules.front().children.push_back(path);
    }
    return g.modules.back();
  }
  HostModule& linear(const std::string& path, int64_t in, int64_t out, bool bias = false) {
    HostModule& m = module(path, ModuleKind::linear);
    m.in_features = in;
    m.out_features = out;
    m.has_bias = bias;
    m.weight_dtype = DType::f32;
    m.weight_id = next_id++;
    return m;
  }
  // A call that reads and writes fresh tensors.
  void call_fresh(const std::string& path) {
    const int64_t in = next_id++;
    call(path, in, next_id++);
  }
  void call(const std::string& path, int64_t in_id, int64_t out_id, int64_t rows = 1) {
    HostCall c;
    c.path = path;
    c.rows = rows;
    c.dtype = DType::f32;
    c.input_id = in_id;
    c.output_id = out_id;
    g.calls.push_back(c);
  }
  // A gated MLP under `p`: gate/up read tensor x, act reads gate's output, down reads h.
  void gated_mlp(const std::string& p, int64_t hidden, int64_t inter, Activation act,
                 bool bias = false, int64_t rows = 1) {
    module(p, ModuleKind::module);
    linear(p + ".gate_proj", hidden, inter, bias);
    linear(p + ".up_proj", hidden, inter, bias);
    linear(p + ".down_proj", inter, hidden, bias);
    module(p + ".act_fn", ModuleKind::activation).activation = act;
    const int64_t x = next_id++, g = next_id++, a = next_id++, u = next_id++, h = next_id++,
                  y = next_id++;
    call(p + ".gate_proj", x, g, rows);
    call(p + ".act_fn", g, a, rows);
    call(p + ".up_proj", x, u, rows);
    call(p + ".down_proj", h, y, rows);
  }
  // Attention projections under `p`: q/k/v read x, o reads the attention output.
  void attention(const std::string& p, int64_t hidden, int64_t rows = 1) {
    module(p, ModuleKind::module);
    const int64_t x = next_id++, o_in = next_id++;
    for (const char* n : {"q_proj", "k_proj", "v_proj"}) {
      linear(p + "." + n, hidden, hidden);
      const int64_t out = next_id++;
      call(p + "." + n, x, out, rows);
    }
    linear(p + ".o_proj", hidden, hidden);
    const int64_t o_out = next_id++;
    call(p + ".o_proj", o_in, o_out, rows);
  }
};

GraphBuilder decoder(int layers, Activation act = Activation::silu) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  b.module("embed", ModuleKind::embedding).weight_id = 999;
  for (int i = 0; i < layers; ++i) {
    b.attention("layers." + std::to_string(i) + ".attn", 512);
    b.gated_mlp("layers." + std::to_string(i) + ".mlp", 512, 1536, act);
  }
  b.linear("head", 512, 4096).weight_id = 999;  // tied to the embedding
  b.call_fresh("head");
  b.g.output_head = "head";
  b.g.input_embedding = "embed";
  return b;
}

std::map<std::string, int> count(const Discovery& d) {
  std::map<std::string, int> c;
  for (const Seam& s : d.seams) ++c[s.structure];
  return c;
}

TEST(Discover, FindsEveryProjectionFfnAndTheTiedHead) {
  const Discovery d = discover(decoder(3).g, catalog(), kDecoderStructures);
  EXPECT_EQ(count(d),
            (std::map<std::string, int>{{"decoder_ffn", 3}, {"linear_proj", 12}, {"lm_head", 1}}));
  EXPECT_TRUE(d.refused.empty());
  const auto head = std::find_if(d.seams.begin(), d.seams.end(),
                                 [](const Seam& s) { return s.structure == "lm_head"; });
  EXPECT_TRUE(head->tied);
  const auto ffn = std::find_if(d.seams.begin(), d.seams.end(),
                                [](const Seam& s) { return s.structure == "decoder_ffn"; });
  EXPECT_EQ(ffn->site, "layers.0.mlp");
  EXPECT_EQ(ffn->slots.at("gate"), "layers.0.mlp.gate_proj");
  EXPECT_EQ(ffn->slots.at("up"), "layers.0.mlp.up_proj");
  EXPECT_EQ(ffn->slots.at("down"), "layers.0.mlp.down_proj");
  EXPECT_EQ(ffn->nodes.at("act"), "layers.0.mlp.act_fn");
  EXPECT_EQ(ffn->dims.at("intermediate"), 1536);
  EXPECT_EQ(ffn->dims.at("hidden"), 512);
  EXPECT_EQ(ffn->activation, Activation::silu);
  EXPECT_EQ(ffn->weight_dtype, DType::f32);
  ASSERT_TRUE(ffn->act_dtype.has_value());
  EXPECT_EQ(*ffn->act_dtype, DType::f32);
  EXPECT_EQ(ffn->weight_count, 3 * 512 * 1536);
  EXPECT_EQ(ffn->shape, "gate/up [1536x512], down [512x1536]");
  const auto proj = std::find_if(d.seams.begin(), d.seams.end(),
                                 [](const Seam& s) { return s.structure == "linear_proj"; });
  EXPECT_EQ(proj->site, "layers.0.attn.q_proj");
  EXPECT_EQ(proj->slots.at("weight"), proj->site);
  EXPECT_EQ(proj->slots.count("bias"), 0u);  // the host's projection has none
  EXPECT_EQ(proj->dims.at("in_features"), 512);
  EXPECT_EQ(proj->shape, "[512x512]");
}

TEST(Discover, AttentionWithFfnShapedProjectionsIsNotAnFfn) {
  // q/k/v share the input and o maps back: FFN-shaped, but no activation consumes one branch.
  GraphBuilder b;
  b.module("", ModuleKind::module);
  b.attention("attn", 256);
  const Discovery d = discover(b.g, catalog(), {"linear_proj", "decoder_ffn"});
  EXPECT_EQ(count(d), (std::map<std::string, int>{{"linear_proj", 4}}));
  EXPECT_TRUE(d.refused.empty());
}

TEST(Discover, GateIsFoundByDataflowNotByName) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  b.module("mlp", ModuleKind::module);
  b.linear("mlp.a", 64, 128);
  b.linear("mlp.b", 64, 128);
  b.linear("mlp.c", 128, 64);
  b.module("mlp.f", ModuleKind::activation).activation = Activation::gelu_tanh;
  b.call("mlp.a", 1, 2);
  b.call("mlp.b", 1, 3);
  b.call("mlp.f", 3, 4);  // the activation reads b's output: b is the gate
  b.call("mlp.c", 5, 6);
  const Discovery d = discover(b.g, catalog(), {"decoder_ffn"});
  ASSERT_EQ(d.seams.size(), 1u);
  EXPECT_EQ(d.seams[0].slots.at("gate"), "mlp.b");
  EXPECT_EQ(d.seams[0].slots.at("up"), "mlp.a");
  EXPECT_EQ(d.seams[0].activation, Activation::gelu_tanh);
}

TEST(Discover, BiasAndForeignActivationsAreRefusedWithTheShape) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  b.gated_mlp("biased", 64, 256, Activation::silu, /*bias=*/true);
  b.gated_mlp("relu", 64, 256, Activation::relu);
  const Discovery d = discover(b.g, catalog(), {"linear_proj", "decoder_ffn"});
  ASSERT_EQ(d.refused.size(), 2u);
  EXPECT_EQ(d.refused[0].first, "biased");
  EXPECT_NE(d.refused[0].second.find("decoder_ffn: biased projections (gate/up [256x64], down "
                                     "[64x256]); the boundary is bias-free"),
            std::string::npos)
      << d.refused[0].second;
  EXPECT_EQ(d.refused[1].first, "relu");
  EXPECT_NE(d.refused[1].second.find("activation 'relu' outside {silu, gelu_tanh}"),
            std::string::npos)
      << d.refused[1].second;
  // The refused regions' projections are still projections.
  EXPECT_EQ(count(d), (std::map<std::string, int>{{"linear_proj", 6}}));
}

TEST(Discover, UnknownStructureIsAnError) {
  EXPECT_THROW(discover(decoder(1).g, catalog(), {"conv2d"}), InvalidArgument);
}

TEST(Discover, NeverCalledProjectionsAreRefusedNotGuessed) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  b.linear("unused", 64, 64);
  const Discovery d = discover(b.g, catalog(), {"linear_proj"});
  EXPECT_TRUE(d.seams.empty());
  ASSERT_EQ(d.refused.size(), 1u);
  EXPECT_NE(d.refused[0].second.find("never called"), std::string::npos);
}

KernelHub& hub() {
  static KernelHub h([] {
    KernelPathConfig c;
    c.bundled_root = FRT_TEST_KERNEL_ROOT;
    return c;
  }());
  return h;
}

TEST(Plan, SchemeNoneKeepsEverySeamAtHostWithAReason) {
  PlanOptions o;
  o.structures = kDecoderStructures;
  o.scheme = "none";
  const Plan p = plan(decoder(2).g, catalog(), o, hub());
  EXPECT_TRUE(p.seats.empty());
  EXPECT_EQ(p.keep_host.size(), 11u);
  EXPECT_NE(p.keep_host[0].second.find("scheme 'none' keeps"), std::string::npos);
}

TEST(Plan, W4KeepsTheHeadAtInt8AndFallsBackToInt8ForOddWidths) {
  GraphBuilder b = decoder(1);
  b.linear("odd", 1000, 512);  // 1000 is not a multiple of 32
  b.call_fresh("odd");
  PlanOptions o;
  o.structures = kDecoderStructures;
  o.scheme = "w4a16_sym_decode";
  o.min_seat_weights = 0;
  const Plan p = plan(b.g, catalog(), o, hub());
  EXPECT_EQ(p.scheme.name, "w4a16_sym_decode");
  // 4 attention projections, the ffn, the head and the odd projection.
  EXPECT_EQ(p.seats.size(), 7u) << explain(p);
  for (const SeatPlan& s : p.seats) {
    if (s.seam.structure == "lm_head" || s.seam.site == "odd") {
      EXPECT_EQ(s.form.format, WeightFormat::int8_channel) << s.seam.site;
      EXPECT_EQ(s.form.name, "int8") << s.seam.site;
      EXPECT_EQ(s.impl, "linear_w8a16") << s.seam.site;
    } else {
      EXPECT_EQ(s.form.describe(), "int4 g32 symmetric") << s.seam.site;
    }
    if (s.seam.site == "odd") {
      ASSERT_EQ(s.ladder.size(), 1u);
      EXPECT_NE(s.ladder[0].find("divisible by 32"), std::string::npos);
    }
  }
}

TEST(Plan, SmallSeamsStayAtHostAndPrefillOnlySeamsAreAssumed) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  b.linear("tiny", 64, 64);
  b.call("tiny", 1, 2);
  b.linear("big", 1024, 1024);
  b.call("big", 3, 4, /*rows=*/128);
  PlanOptions o;
  o.structures = {"linear_proj"};
  o.scheme = "w8a16_decode";  // min_seat_weights unset: the catalog's keep_host rule
  const Plan p = plan(b.g, catalog(), o, hub());
  ASSERT_EQ(catalog().schemes().min_seat_weights, 65536);
  ASSERT_EQ(p.keep_host.size(), 1u);
  EXPECT_EQ(p.keep_host[0].first, "tiny");
  EXPECT_NE(p.keep_host[0].second.find("4096 weights, below the 65536"), std::string::npos)
      << p.keep_host[0].second;
  ASSERT_EQ(p.seats.size(), 1u);
  ASSERT_EQ(p.assumed.size(), 1u);
  EXPECT_NE(p.assumed[0].find("observed only 128-row calls"), std::string::npos);
  const std::string text = explain(p);
  EXPECT_NE(text.find("1 seated, 1 kept at host, 0 refused"), std::string::npos);
}

// A form with a band of its own (the w8a8 GEMM form: many rows) sets the seat's band instead of
// the structure's decode band; a seam whose calls all fall below it stays at host, saying so.
TEST(Plan, AFormBandReplacesTheDecodeBandAndSmallCallSeamsStayAtHost) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  b.linear("tokens", 1024, 1024, /*bias=*/true);
  b.call("tokens", 1, 2, /*rows=*/256);
  b.linear("timestep", 1024, 1024);
  b.call("timestep", 3, 4, /*rows=*/1);
  PlanOptions o;
  o.structures = {"linear_proj"};
  o.scheme = "w8a8_dynamic";
  const Plan p = plan(b.g, catalog(), o, hub());
  const WeightForm& form = catalog().schemes().forms.at("int8_rows");
  ASSERT_EQ(p.seats.size(), 1u) << explain(p);
  const SeatPlan& s = p.seats[0];
  EXPECT_EQ(s.site, "tokens");
  EXPECT_EQ(s.package, "flashrt/gemm");
  EXPECT_EQ(s.impl, "gemm_w8a8");
  EXPECT_EQ(s.band_min, form.rows_min);
  EXPECT_GT(s.band_max, int64_t{1} << 40);
  ASSERT_EQ(s.ladder.size(), 1u);  // the decode linear stepped aside: it takes no such form
  EXPECT_NE(s.ladder[0].find("linear_w8a8"), std::string::npos) << s.ladder[0];
  ASSERT_EQ(p.keep_host.size(), 1u);
  EXPECT_EQ(p.keep_host[0].first, "timestep");
  EXPECT_NE(p.keep_host[0].second.find("observed only calls of 1 rows or fewer"), std::string::npos)
      << p.keep_host[0].second;
  EXPECT_NE(explain(p).find("rows " + std::to_string(form.rows_min) + "..,"), std::string::npos)
      << explain(p);
}

// A feed-forward laid out as diffusers' FeedForward: `p` holds a list `p.net` whose first entry
// is an activation module wrapping the up projection, then down; `p` itself reads x and returns
// down's output (`out_id` 0), or returns another tensor (`out_id` set: a module that does more).
GraphBuilder wrapped_ffn(const std::string& p, int64_t rows, int64_t out_id = 0) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  b.module(p, ModuleKind::module);
  b.module(p + ".net", ModuleKind::module);  // a list: never called
  b.module(p + ".net.0", ModuleKind::activation).activation = Activation::gelu_tanh;
  b.linear(p + ".net.0.proj", 512, 2048, /*bias=*/true);
  b.linear(p + ".net.2", 2048, 512, /*bias=*/true);
  const int64_t x = 100, u = 101, h = 102, y = 103;
  b.call(p, x, out_id != 0 ? out_id : y, rows);
  b.call(p + ".net.0.proj", x, u, rows);
  b.call(p + ".net.0", u, h, rows);
  b.call(p + ".net.2", h, y, rows);
  return b;
}

// Note [Enclosing site]: nodes split across modules are one seam at the module whose calls read
// the region's input and return its output; the fused GEMM feed-forward takes it under the w8a8
// form, ahead of the per-projection rung.
TEST(Plan, AnFfnSplitAcrossModulesIsSeatedAtTheModuleThatComputesIt) {
  const Discovery d = discover(wrapped_ffn("ff", 256).g, catalog(), {"encoder_ffn"});
  ASSERT_EQ(d.seams.size(), 1u);
  EXPECT_TRUE(d.refused.empty());
  EXPECT_EQ(d.seams[0].site, "ff");
  EXPECT_EQ(d.seams[0].activation, Activation::gelu_tanh);
  PlanOptions o;
  o.structures = {"encoder_ffn", "linear_proj"};
  o.scheme = "w8a8_dynamic";
  const Plan p = plan(wrapped_ffn("ff", 256).g, catalog(), o, hub());
  ASSERT_EQ(p.seats.size(), 1u) << explain(p);
  const SeatPlan& s = p.seats[0];
  EXPECT_EQ(s.site, "ff");
  EXPECT_EQ(s.op, OpKind::ffn);
  EXPECT_EQ(s.package, "flashrt/gemm");
  EXPECT_EQ(s.impl, "gemm_ffn_w8a8");
  EXPECT_EQ(s.slots.at("up").module, "ff.net.0.proj");
  EXPECT_EQ(s.slots.at("down_bias").module, "ff.net.2");
  ASSERT_FALSE(s.ladder.empty());
  EXPECT_NE(s.ladder[0].find("unknown weight format 16"), std::string::npos) << s.ladder[0];
}

TEST(Plan, AnFfnSplitAcrossModulesWhoseOuterModuleDoesMoreIsRefused) {
  const Discovery d =
      discover(wrapped_ffn("ff", 256, /*out_id=*/555).g, catalog(), {"encoder_ffn"});
  EXPECT_TRUE(d.seams.empty());
  ASSERT_EQ(d.refused.size(), 1u);
  EXPECT_NE(d.refused[0].second.find("split across modules"), std::string::npos)
      << d.refused[0].second;
}

TEST(Plan, WeightDtypesOutsideTheImplsAreRefusedByName) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  b.linear("half", 1024, 1024).weight_dtype = DType::f16;
  b.call("half", 1, 2);
  PlanOptions o;
  o.structures = {"linear_proj"};
  o.scheme = "w8a16_decode";
  const Plan p = plan(b.g, catalog(), o, hub());
  ASSERT_EQ(p.refused.size(), 1u);
  EXPECT_NE(p.refused[0].second.find("weight dtype f16"), std::string::npos);
}

TEST(Plan, AMissingFfnPackageStepsDownTheLadderToProjections) {
  KernelPathConfig c;  // only the linear package is on this path
  c.local_kernels = {{"flashrt/linear", std::string(FRT_TEST_KERNEL_ROOT) + "/flashrt/linear"}};
  c.bundled_root = "/nonexistent";
  KernelHub only_linear(c);
  PlanOptions o;
  o.structures = kDecoderStructures;
  o.scheme = "w8a16_channel_decode";
  o.min_seat_weights = 0;
  const Plan p = plan(decoder(1).g, catalog(), o, only_linear);
  std::vector<const SeatPlan*> ffn;
  for (const SeatPlan& s : p.seats)
    if (s.seam.structure == "decoder_ffn") ffn.push_back(&s);
  // The per-node rung seats each of the region's projections on its own.
  ASSERT_EQ(ffn.size(), 3u) << explain(p);
  const std::vector<std::string> sites = {"layers.0.mlp.gate_proj", "layers.0.mlp.up_proj",
                                          "layers.0.mlp.down_proj"};
  for (size_t i = 0; i < ffn.size(); ++i) {
    EXPECT_EQ(ffn[i]->impl, "ffn_as_projections_w8a16");
    EXPECT_EQ(ffn[i]->package, "flashrt/linear");
    EXPECT_EQ(ffn[i]->op, OpKind::linear);
    EXPECT_EQ(ffn[i]->site, sites[i]);
    EXPECT_EQ(ffn[i]->replaces, std::vector<std::string>{sites[i]});
    EXPECT_EQ(ffn[i]->slots.at("weight").module, sites[i]);
    EXPECT_EQ(ffn[i]->slots.at("weight").tensor, "weight");
    ASSERT_EQ(ffn[i]->ladder.size(), 1u);
    EXPECT_NE(ffn[i]->ladder[0].find("flashrt/ffn unavailable"), std::string::npos);
  }
  ASSERT_FALSE(p.kernel_unavailable.empty());
  EXPECT_EQ(p.kernel_unavailable[0].repo, "flashrt/ffn");
}

TEST(Plan, SeatsCarryTheirOpFormAndOperandTensors) {
  PlanOptions o;
  o.structures = kDecoderStructures;
  o.scheme = "w8a16_channel_decode";
  const Plan p = plan(decoder(1).g, catalog(), o, hub());
  EXPECT_EQ(p.seams_found, 6);
  ASSERT_EQ(p.seats.size(), 6u) << explain(p);
  EXPECT_TRUE(p.refused.empty()) << explain(p);
  std::map<std::string, const SeatPlan*> by_site;
  for (const SeatPlan& s : p.seats) by_site[s.site] = &s;

  const SeatPlan* ffn = by_site.at("layers.0.mlp");
  EXPECT_EQ(ffn->seam.structure, "decoder_ffn");
  EXPECT_EQ(ffn->op, OpKind::gated_ffn);
  EXPECT_EQ(ffn->impl, "ffn_w8a16");
  EXPECT_EQ(ffn->package, "flashrt/ffn");
  EXPECT_EQ(ffn->replaces, std::vector<std::string>{"layers.0.mlp"});
  EXPECT_EQ(ffn->form.format, WeightFormat::int8_channel);
  EXPECT_EQ(ffn->form.describe(), "int8 per-channel");
  EXPECT_EQ(ffn->activation, Activation::silu);
  EXPECT_EQ(ffn->act_dtype, DType::f32);
  EXPECT_EQ(ffn->band_min, 1);
  EXPECT_EQ(ffn->band_max, 16);
  EXPECT_TRUE(ffn->ladder.empty());
  ASSERT_EQ(ffn->slots.size(), 3u);
  for (const char* operand : {"gate", "up", "down"}) {
    EXPECT_EQ(ffn->slots.at(operand).module, "layers.0.mlp." + std::string(operand) + "_proj");
    EXPECT_EQ(ffn->slots.at(operand).tensor, "weight");
  }

  const SeatPlan* q = by_site.at("layers.0.attn.q_proj");
  EXPECT_EQ(q->seam.structure, "linear_proj");
  EXPECT_EQ(q->op, OpKind::linear);
  EXPECT_EQ(q->impl, "linear_w8a16");
  EXPECT_EQ(q->package, "flashrt/linear");
  ASSERT_EQ(q->slots.size(), 1u);  // no bias on the host
  EXPECT_EQ(q->slots.at("weight").module, "layers.0.attn.q_proj");

  const SeatPlan* head = by_site.at("head");
  EXPECT_EQ(head->seam.structure, "lm_head");
  EXPECT_TRUE(head->seam.tied);
  EXPECT_EQ(head->op, OpKind::linear);
  ASSERT_EQ(p.assumed.size(), 1u);
  EXPECT_NE(p.assumed[0].find("head: weight tied to embed"), std::string::npos) << p.assumed[0];
}

TEST(Plan, ABiasedProjectionSeatsItsBias) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  b.linear("proj", 512, 256, /*bias=*/true);
  b.call("proj", 1, 2);
  PlanOptions o;
  o.structures = {"linear_proj"};
  o.scheme = "w8a16_decode";
  const Plan p = plan(b.g, catalog(), o, hub());
  ASSERT_EQ(p.seats.size(), 1u) << explain(p);
  EXPECT_EQ(p.seats[0].slots.at("weight").tensor, "weight");
  EXPECT_EQ(p.seats[0].slots.at("bias").module, "proj");
  EXPECT_EQ(p.seats[0].slots.at("bias").tensor, "bias");
}

TEST(Plan, UnknownSchemeIsAnError) {
  PlanOptions o;
  o.scheme = "w3a3";
  EXPECT_THROW(plan(decoder(1).g, catalog(), o, hub()), InvalidArgument);
  PlanOptions unknown_structure;
  unknown_structure.structures = {"conv2d"};
  EXPECT_THROW(plan(decoder(1).g, catalog(), unknown_structure, hub()), InvalidArgument);
}

// A DiT-like block under `p`: a norm without affine whose output is modulated (x*scale+shift)
// into the self-attention's q/k/v; a cross-attention whose q reads the hidden states and whose
// k/v read the text. `form` is the norm's measured form; `modulated` says whether the
// projections' input is the modulated norm output.
void dit_block(GraphBuilder& b, const std::string& p, NormForm form, bool modulated,
               int64_t rows = 256) {
  b.module(p, ModuleKind::module);
  HostModule& norm = b.module(p + ".norm1", ModuleKind::norm);
  norm.norm = NormFacts{form, 0, /*affine=*/false, ""};
  if (modulated) norm.norm.modulation = "in " + p + ".forward from table [6, 512]";
  b.module(p + ".attn1", ModuleKind::module);
  b.module(p + ".attn2", ModuleKind::module);
  const int64_t h = b.next_id++, n = b.next_id++, x = b.next_id++, text = b.next_id++;
  b.call(p + ".norm1", h, n, rows);
  for (const char* name : {"to_q", "to_k", "to_v"}) {
    b.linear(p + ".attn1." + name, 512, 512, true);
    b.call(p + ".attn1." + name, x, b.next_id++, rows);
    if (modulated) b.g.calls.back().modulated_from = n;
  }
  for (const char* name : {"to_q", "to_k", "to_v"}) {
    b.linear(p + ".attn2." + name, 512, 512, true);
    b.call(p + ".attn2." + name, std::string(name) == "to_q" ? x + 1000 : text, b.next_id++,
           std::string(name) == "to_q" ? rows : 12);
  }
}

TEST(Discover, SiblingsOfOneInputPackAndACrossAttentionPacksOnlyItsKeyAndValue) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  dit_block(b, "blocks.0", NormForm::layer, false);
  const Discovery d = discover(b.g, catalog(), {"qkv_pack", "linear_proj"});
  EXPECT_EQ(count(d), (std::map<std::string, int>{{"linear_proj", 1}, {"qkv_pack", 2}}));
  for (const Seam& s : d.seams) {
    if (s.structure == "linear_proj") {
      EXPECT_EQ(s.site, "blocks.0.attn2.to_q");
    }
    if (s.structure != "qkv_pack") continue;
    if (s.site == "blocks.0.attn1") {
      EXPECT_EQ(s.nodes.size(), 3u);
    } else {
      EXPECT_EQ(s.site, "blocks.0.attn2");
      EXPECT_EQ(s.nodes.size(), 2u);  // the optional third node left out
      EXPECT_EQ(s.nodes.at("q"), "blocks.0.attn2.to_k");
      EXPECT_EQ(s.shape, "q/k [512x512]");
    }
  }
  EXPECT_TRUE(d.refused.empty());
}

TEST(Discover, ProjectionsSharingAnInputAcrossModulesAreNotAPack) {
  // Siblings only: a projection of the block reading the attention's input is not packed with it.
  GraphBuilder b;
  b.module("", ModuleKind::module);
  b.module("blk", ModuleKind::module);
  b.module("blk.attn", ModuleKind::module);
  const int64_t x = b.next_id++;
  b.linear("blk.proj_mlp", 512, 2048);
  b.call("blk.proj_mlp", x, b.next_id++);
  b.linear("blk.attn.to_q", 512, 512);
  b.call("blk.attn.to_q", x, b.next_id++);
  const Discovery d = discover(b.g, catalog(), {"qkv_pack"});
  EXPECT_TRUE(d.seams.empty());
  EXPECT_TRUE(d.refused.empty());
}

TEST(Discover, AModulatedNormChainIsRefusedWithWhereItsModulationIsComputed) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  dit_block(b, "blocks.0", NormForm::layer, true);
  dit_block(b, "blocks.1", NormForm::rms, true);
  dit_block(b, "blocks.2", NormForm::layer, false);  // no modulation: no chain at all
  const Discovery d = discover(b.g, catalog(), {"modnorm_qkv_chain", "qkv_pack", "linear_proj"});
  ASSERT_EQ(d.refused.size(), 2u);
  EXPECT_EQ(d.refused[0].first, "blocks.0");
  EXPECT_EQ(d.refused[0].second,
            "modnorm_qkv_chain: modulation of blocks.0.norm1 is computed in blocks.0.forward from "
            "table [6, 512]; no module boundary holds norm\u2192modulation\u2192q/k/v (q/k/v "
            "[512x512] in blocks.0.attn1), so its projections stay free for other structures");
  EXPECT_EQ(d.refused[1].first, "blocks.1");
  EXPECT_EQ(d.refused[1].second, "modnorm_qkv_chain: norm 'rms' outside {layer} (q/k/v [512x512])");
  // Every block's projections stay free: the packs and the cross-attention's q.
  EXPECT_EQ(count(d), (std::map<std::string, int>{{"linear_proj", 3}, {"qkv_pack", 6}}));
}

TEST(Plan, APackYieldsToItsProjectionsWhereTheSchemeGivesItNoForm) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  dit_block(b, "blocks.0", NormForm::layer, false);
  PlanOptions o;
  o.scheme = "w8a16_decode";
  o.structures = {"qkv_pack", "linear_proj"};
  o.min_seat_weights = 0;
  Plan p = plan(b.g, catalog(), o, hub());
  for (const SeatPlan& s : p.seats) EXPECT_EQ(s.seam.structure, "linear_proj") << explain(p);
  EXPECT_EQ(p.seats.size() + p.keep_host.size(), 6u) << explain(p);
  o.scheme = "w8a8_dynamic";
  p = plan(b.g, catalog(), o, hub());
  // The self-attention pack and the cross-attention's q; its k/v pack saw only 12-row calls.
  ASSERT_EQ(p.seats.size(), 2u) << explain(p);
  ASSERT_EQ(p.keep_host.size(), 2u);  // under each projection's own name
  EXPECT_EQ(p.keep_host[0].first, "blocks.0.attn2.to_k");
  EXPECT_EQ(p.keep_host[1].first, "blocks.0.attn2.to_v");
  const auto pack = std::find_if(p.seats.begin(), p.seats.end(), [](const SeatPlan& s) {
    return s.seam.structure == "qkv_pack" && s.replaces.size() == 3;
  });
  ASSERT_NE(pack, p.seats.end());
  EXPECT_EQ(pack->replaces, (std::vector<std::string>{"blocks.0.attn1.to_q", "blocks.0.attn1.to_k",
                                                      "blocks.0.attn1.to_v"}));
  EXPECT_EQ(pack->slots.at("k_bias").module, "blocks.0.attn1.to_k");
  EXPECT_NE(explain(p).find("one GEMM for blocks.0.attn1.to_q"), std::string::npos);
}

// explain() writes seats, keep-at-host and refusals that differ only by the layer index once,
// with the index set and the count (Note [Explain groups]); verbose lists each; the counts in
// the header are the same either way.
TEST(Plan, ExplainGroupsLayersThatDifferOnlyByTheirIndex) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  for (int i = 0; i < 6; ++i) {
    b.attention("layers." + std::to_string(i) + ".attn", 512);
    b.gated_mlp("layers." + std::to_string(i) + ".mlp", 512, 1536,
                i == 3 ? Activation::relu : Activation::silu);
  }
  PlanOptions o;
  o.structures = kDecoderStructures;
  o.scheme = "w8a16_decode";
  o.min_seat_weights = 0;
  const Plan p = plan(b.g, catalog(), o, hub());
  ASSERT_EQ(p.refused.size(), 1u) << explain(p, true);
  const std::string grouped = explain(p), verbose = explain(p, /*verbose=*/true);
  const std::string header = verbose.substr(0, verbose.find('\n'));
  EXPECT_EQ(grouped.substr(0, grouped.find('\n')), header);
  EXPECT_NE(header.find(std::to_string(p.seats.size()) + " seated"), std::string::npos);
  const auto line = [](const std::string& text, const std::string& start) {
    const size_t at = text.find("\n  " + start);
    return at == std::string::npos ? std::string()
                                   : text.substr(at + 3, text.find('\n', at + 1) - at - 3);
  };
  // q_proj of every layer: one line, the same text as layer 0's but for the index set.
  const std::string q0 = line(verbose, "layers.0.attn.q_proj");
  ASSERT_FALSE(q0.empty()) << verbose;
  EXPECT_EQ(line(grouped, "layers.{0..5}.attn.q_proj"),
            "layers.{0..5}" + q0.substr(std::string("layers.0").size()) + "  x6")
      << grouped;
  // Layer 3's relu MLP is refused: the other five feed-forwards are one line, layer 3's
  // refusal and its projections' seats stand alone, without braces.
  EXPECT_NE(line(grouped, "layers.{0..2,4..5}.mlp  decoder_ffn"), "") << grouped;
  EXPECT_NE(grouped.find("x5\n"), std::string::npos) << grouped;
  ASSERT_NE(line(verbose, "layers.3.mlp  "), "") << verbose;
  EXPECT_EQ(line(grouped, "layers.3.mlp  "), line(verbose, "layers.3.mlp  "));
  EXPECT_NE(line(grouped, "layers.3.mlp.gate_proj  linear_proj"), "") << grouped;
  EXPECT_NE(grouped.find("the verbose form lists each"), std::string::npos);
  // Verbose: every seat on its own line, nothing merged.
  for (const SeatPlan& s : p.seats) EXPECT_NE(line(verbose, s.site + "  "), "") << s.site;
  EXPECT_EQ(verbose.find("{0.."), std::string::npos) << verbose;
  EXPECT_EQ(verbose.find("verbose form"), std::string::npos);
}

// A routed MoE layer under `p`: a router with weight [experts, hidden] and a bank of experts
// (fused gate_up [E, 2F, D], down [E, D, F]) called with the hidden rows.
GraphBuilder moe_decoder(int layers, ExpertFacts bank, Activation act = Activation::silu) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  b.module("embed", ModuleKind::embedding).weight_id = 999;
  for (int i = 0; i < layers; ++i) {
    const std::string p = "layers." + std::to_string(i);
    b.attention(p + ".attn", bank.hidden);
    b.module(p + ".mlp", ModuleKind::module);
    b.module(p + ".mlp.gate", ModuleKind::module).type_name = "Router";
    HostModule& m = b.module(p + ".mlp.experts", ModuleKind::experts);
    m.experts = bank;
    m.experts.router = p + ".mlp.gate";
    m.activation = act;
    m.in_features = m.out_features = bank.hidden;
    b.call_fresh(p + ".mlp.experts");
    b.g.params.push_back(
        {p + ".mlp.gate", "weight", {bank.experts, bank.hidden}, bank.experts * bank.hidden});
    b.g.params.push_back({p + ".mlp.experts",
                          bank.gate_up.empty() ? "up_proj" : bank.gate_up,
                          {bank.experts, 2 * bank.intermediate, bank.hidden},
                          2 * bank.experts * bank.intermediate * bank.hidden});
    b.g.params.push_back({p + ".mlp.experts",
                          "down_proj",
                          {bank.experts, bank.hidden, bank.intermediate},
                          bank.experts * bank.intermediate * bank.hidden});
  }
  b.g.input_embedding = "embed";
  return b;
}

ExpertFacts qwen3_bank() {
  ExpertFacts e;
  e.experts = 128;
  e.hidden = 512;
  e.intermediate = 256;
  e.top_k = 8;
  e.gate_up = "gate_up_proj";
  e.down = "down_proj";
  return e;
}

TEST(Plan, ABankOfExpertsIsOneSeatReadingTheHalvesOfItsFusedTensor) {
  PlanOptions o;
  o.scheme = "w8a16_decode";
  const Plan p = plan(moe_decoder(2, qwen3_bank()).g, catalog(), o, hub());
  int banks = 0;
  for (const SeatPlan& s : p.seats) {
    if (s.seam.structure != "moe_experts") continue;
    ++banks;
    EXPECT_EQ(s.op, OpKind::moe_ffn);
    EXPECT_EQ(s.package, "flashrt/ffn");
    EXPECT_EQ(s.seam.top_k, 8);
    EXPECT_EQ(s.seam.dims.at("experts"), 128);
    EXPECT_EQ(s.slots.at("gate").tensor, "gate_up_proj");
    EXPECT_EQ(s.slots.at("gate").part, 0);
    EXPECT_EQ(s.slots.at("up").part, 1);
    EXPECT_EQ(s.slots.at("up").parts, 2);
    EXPECT_EQ(s.slots.at("down").tensor, "down_proj");
    EXPECT_EQ(s.band_max, 16);
  }
  EXPECT_EQ(banks, 2) << explain(p);
  EXPECT_NE(explain(p).find("128 experts, gate/up [256x512], down [512x256], top-8"),
            std::string::npos)
      << explain(p);
}

TEST(Plan, BanksOutsideTheBoundaryAreRefusedByFormAndShape) {
  struct Case {
    const char* why;
    ExpertFacts bank;
    Activation act;
  };
  ExpertFacts transposed = qwen3_bank(), biased = qwen3_bank(), ungated = qwen3_bank();
  transposed.transposed = true;
  biased.has_bias = true;
  ungated.gate_up.clear();
  ungated.up = "up_proj";
  for (const Case& c : {Case{"transposed", transposed, Activation::silu},
                        Case{"per-expert biases", biased, Activation::silu},
                        Case{"ungated experts", ungated, Activation::silu},
                        Case{"clamped", qwen3_bank(), Activation::unknown},
                        Case{"activation 'gelu' outside", qwen3_bank(), Activation::gelu}}) {
    PlanOptions o;
    o.scheme = "w8a16_decode";
    const Plan p = plan(moe_decoder(1, c.bank, c.act).g, catalog(), o, hub());
    const auto it = std::find_if(p.refused.begin(), p.refused.end(), [](const SiteReason& r) {
      return r.first == "layers.0.mlp.experts";
    });
    ASSERT_NE(it, p.refused.end()) << c.why << "\n" << explain(p);
    EXPECT_NE(it->second.find(c.why), std::string::npos) << it->second;
    EXPECT_NE(it->second.find("128 experts"), std::string::npos) << it->second;
    for (const SeatPlan& s : p.seats) EXPECT_NE(s.seam.structure, "moe_experts");
  }
}

TEST(Plan, TheIntegerActivationSchemesSeatTheBankOnTheGemmPackage) {
  for (const char* scheme : {"w8a8_decode", "w4a8_decode", "w4a8_asym_decode"}) {
    PlanOptions o;
    o.scheme = scheme;
    const Plan p = plan(moe_decoder(1, qwen3_bank()).g, catalog(), o, hub());
    const SeatPlan* bank = nullptr;
    for (const SeatPlan& s : p.seats)
      if (s.seam.structure == "moe_experts") bank = &s;
    ASSERT_NE(bank, nullptr) << scheme << "\n" << explain(p);
    EXPECT_EQ(bank->op, OpKind::moe_ffn) << scheme;
    EXPECT_EQ(bank->package, "flashrt/gemm") << scheme;
    EXPECT_EQ(bank->form.format, std::string(scheme) == "w8a8_decode" ? WeightFormat::int8_gemm
                                                                      : WeightFormat::int4_gemm)
        << scheme;
    EXPECT_EQ(bank->form.group, 32) << scheme;
  }
}

TEST(Plan, ASchemeWithoutABankFormKeepsTheBankWithTheReason) {
  PlanOptions o;
  o.scheme = "w8a8_dynamic";
  const Plan p = plan(moe_decoder(1, qwen3_bank()).g, catalog(), o, hub());
  const auto it = std::find_if(p.keep_host.begin(), p.keep_host.end(), [](const SiteReason& r) {
    return r.first == "layers.0.mlp.experts";
  });
  ASSERT_NE(it, p.keep_host.end()) << explain(p);
  EXPECT_NE(it->second.find("keeps moe_experts"), std::string::npos) << it->second;
}

// A checkpoint's own form, as an adoption reader names it.
WeightForm source_form(const std::string& name, WeightFormat format, bool symmetric) {
  WeightForm f;
  f.name = f.tag = name;
  f.format = format;
  f.group = 32;
  f.symmetric = symmetric;
  f.scale_dtype = DType::f16;
  return f;
}

const SeatPlan* seat_at(const Plan& p, const std::string& site) {
  for (const SeatPlan& s : p.seats)
    if (s.site == site) return &s;
  return nullptr;
}

// A region the checkpoint holds in two forms that no one package takes both of: seated per
// projection, each on the first per-node rung whose package takes its own form (GGUF Q4_K with
// int8 activations on flashrt/gemm beside a Q5_0 down, int8 g32, on flashrt/linear), each seat's
// ladder naming the rung it passed.
TEST(Plan, AMixedFormRegionIsSeatedPerProjectionAcrossPackages) {
  WeightForm q4k = source_form("gguf_q4_k_a8", WeightFormat::int4_super_gemm, false);
  const WeightForm q5 = source_form("gguf_q5_0", WeightFormat::int8_group, true);
  PlanOptions o;
  o.source = "gguf";
  o.structures = {"decoder_ffn"};
  o.source_forms["layers.0.mlp.gate_proj"] = q4k;
  o.source_forms["layers.0.mlp.up_proj"] = q4k;
  o.source_forms["layers.0.mlp.down_proj"] = q5;
  const Plan p = plan(decoder(1).g, catalog(), o, hub());
  ASSERT_TRUE(p.refused.empty()) << explain(p);
  for (const char* proj : {"gate_proj", "up_proj"}) {
    const SeatPlan* s = seat_at(p, std::string("layers.0.mlp.") + proj);
    ASSERT_NE(s, nullptr) << explain(p);
    EXPECT_EQ(s->package, "flashrt/gemm");
    EXPECT_EQ(s->impl, "gemm_as_projections_gguf_q4_k_a8");
    ASSERT_FALSE(s->ladder.empty());
    EXPECT_NE(s->ladder.back().find("ffn_as_projections_gguf_q4_k_a8: linear"), std::string::npos)
        << s->ladder.back();
  }
  const SeatPlan* down = seat_at(p, "layers.0.mlp.down_proj");
  ASSERT_NE(down, nullptr) << explain(p);
  EXPECT_EQ(down->package, "flashrt/linear");
  EXPECT_EQ(down->impl, "ffn_as_projections_gguf_q5_0");
  // A projection in a form no per-node rung's package takes (int8_gemm in blocks of 48) leaves
  // the region refused, the reason naming each rung.
  q4k.format = WeightFormat::int8_gemm;
  q4k.group = 48;
  o.source_forms["layers.0.mlp.gate_proj"] = q4k;
  const Plan r = plan(decoder(1).g, catalog(), o, hub());
  ASSERT_EQ(r.refused.size(), 1u) << explain(r);
  EXPECT_NE(r.refused[0].second.find("ffn_as_projections_gguf_q4_k_a8: linear"), std::string::npos)
      << r.refused[0].second;
  EXPECT_NE(r.refused[0].second.find("gemm_as_projections_gguf_q4_k_a8: gemm"), std::string::npos)
      << r.refused[0].second;
}

TEST(Plan, AnAdoptedBankTakesItsSourceFormAndAMixedFormBankIsRefused) {
  const WeightForm q8 = source_form("gguf_q8_0", WeightFormat::int8_group, true);
  const WeightForm q4 = source_form("gguf_q4_0", WeightFormat::int4_group, true);
  PlanOptions o;
  o.source = "gguf";
  o.structures = {"moe_experts"};
  // Layer 0 keyed by its module (all three operands), layer 1 per operand.
  o.source_forms["layers.0.mlp.experts"] = q4;
  for (const char* op : {"gate", "up", "down"})
    o.source_forms[std::string("layers.1.mlp.experts/") + op] = q8;
  const Plan p = plan(moe_decoder(2, qwen3_bank()).g, catalog(), o, hub());
  EXPECT_EQ(p.scheme.name, "adopt gguf");
  const SeatPlan* s0 = seat_at(p, "layers.0.mlp.experts");
  const SeatPlan* s1 = seat_at(p, "layers.1.mlp.experts");
  ASSERT_NE(s0, nullptr) << explain(p);
  ASSERT_NE(s1, nullptr) << explain(p);
  EXPECT_EQ(s0->op, OpKind::moe_ffn);
  EXPECT_EQ(s0->form.name, "gguf_q4_0");
  EXPECT_EQ(s0->impl, "moe_gguf_q4_0");
  EXPECT_EQ(s1->form.name, "gguf_q8_0");
  EXPECT_EQ(s1->slots.at("up").part, 1);

  // down in another form than gate and up: one bank op runs one form, so the bank is refused.
  o.source_forms["layers.1.mlp.experts/down"] = q4;
  const Plan mixed = plan(moe_decoder(2, qwen3_bank()).g, catalog(), o, hub());
  EXPECT_NE(seat_at(mixed, "layers.0.mlp.experts"), nullptr);
  EXPECT_EQ(seat_at(mixed, "layers.1.mlp.experts"), nullptr);
  const auto it = std::find_if(mixed.refused.begin(), mixed.refused.end(), [](const SiteReason& r) {
    return r.first == "layers.1.mlp.experts";
  });
  ASSERT_NE(it, mixed.refused.end()) << explain(mixed);
  EXPECT_NE(it->second.find("gguf checkpoint holds the bank's gate gguf_q8_0, up gguf_q8_0, "
                            "down gguf_q4_0; one bank op runs one form"),
            std::string::npos)
      << it->second;

  // A block type no kernel reads refuses the bank by name; an operand held unquantised keeps
  // the bank with the host.
  o.source_forms.erase("layers.1.mlp.experts/down");
  o.source_refusals["layers.1.mlp.experts/down"] = "blk.1.ffn_down_exps.weight is Q5_0 blocks";
  o.source_forms.erase("layers.0.mlp.experts");
  o.source_forms["layers.0.mlp.experts/gate"] = q4;
  o.source_forms["layers.0.mlp.experts/up"] = q4;
  const Plan partial = plan(moe_decoder(2, qwen3_bank()).g, catalog(), o, hub());
  EXPECT_TRUE(partial.seats.empty()) << explain(partial);
  ASSERT_EQ(partial.refused.size(), 1u) << explain(partial);
  EXPECT_NE(partial.refused[0].second.find(
                "layers.1.mlp.experts/down: blk.1.ffn_down_exps.weight is Q5_0 blocks"),
            std::string::npos)
      << partial.refused[0].second;
  ASSERT_EQ(partial.keep_host.size(), 1u) << explain(partial);
  EXPECT_EQ(partial.keep_host[0].first, "layers.0.mlp.experts");
  EXPECT_NE(partial.keep_host[0].second.find("holds layers.0.mlp.experts/down unquantised"),
            std::string::npos)
      << partial.keep_host[0].second;
}

TEST(Plan, EveryLargeWeightIsSeatedKeptOrRefusedNeverSilent) {
  GraphBuilder b = moe_decoder(1, qwen3_bank());
  // A module no structure describes, holding a large 2-D weight, and a small one.
  b.module("adapter", ModuleKind::module).type_name = "LoraBank";
  b.g.params.push_back({"adapter", "lora_a", {512, 1024}, 512 * 1024});
  b.g.params.push_back({"adapter", "tiny", {4, 4}, 16});
  b.g.params.push_back({"embed", "weight", {4096, 512}, 4096 * 512});  // the lookup: exempt
  PlanOptions o;
  o.scheme = "w8a16_decode";
  const Plan p = plan(b.g, catalog(), o, hub());
  const auto find = [](const std::vector<SiteReason>& rs, const std::string& site) {
    return std::find_if(rs.begin(), rs.end(), [&](const SiteReason& r) { return r.first == site; });
  };
  const auto lora = find(p.refused, "adapter");
  ASSERT_NE(lora, p.refused.end()) << explain(p);
  EXPECT_NE(lora->second.find("lora_a [512x1024] in LoraBank: no catalog structure describes it"),
            std::string::npos)
      << lora->second;
  EXPECT_EQ(find(p.refused, "embed"), p.refused.end());
  // The router [128 x 512] is below the catalog's size; at size 1 it is named, kept at host.
  EXPECT_EQ(find(p.keep_host, "layers.0.mlp.gate"), p.keep_host.end());
  o.account_weights = 1;
  const Plan all = plan(b.g, catalog(), o, hub());
  const auto router = find(all.keep_host, "layers.0.mlp.gate");
  ASSERT_NE(router, all.keep_host.end()) << explain(all);
  EXPECT_NE(router->second.find("router of layers.0.mlp.experts"), std::string::npos);
  EXPECT_EQ(std::count_if(all.refused.begin(), all.refused.end(),
                          [](const SiteReason& r) { return r.first == "adapter"; }),
            2);  // lora_a and tiny, each named
  // Asked for chosen structures, the plan names only what it was asked about.
  o.structures = {"linear_proj"};
  const Plan chosen = plan(b.g, catalog(), o, hub());
  EXPECT_EQ(find(chosen.refused, "adapter"), chosen.refused.end());
}

// A linear-attention layer under `p`: its module calls the gated delta rule (measured `form`,
// the dims its calls showed) and hands its depthwise convolution's weight to a convolution
// function; its projections around them are ordinary linears.
GraphBuilder linear_attention(RecurrenceForm form, bool conv_called = true, int64_t groups = 0) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  const std::string p = "layers.0.linear_attn";
  HostModule& m = b.module(p, ModuleKind::recurrence);
  m.recurrence.form = form;
  m.recurrence.k_heads = 16;
  m.recurrence.v_heads = 32;
  m.recurrence.k_dim = m.recurrence.v_dim = 128;
  m.recurrence.l2norm = true;
  if (form == RecurrenceForm::other) m.recurrence.other = "it differs by 0.5 on a probe";
  b.call(p, b.next_id, b.next_id + 1, 12);
  b.next_id += 2;
  HostModule& c = b.module(p + ".conv1d", ModuleKind::conv);
  c.conv.channels = 8192;
  c.conv.taps = 4;
  c.conv.groups = groups == 0 ? 8192 : groups;
  c.conv.activated = true;
  c.conv.activation = Activation::silu;
  if (conv_called) {
    c.conv.functions = {"modeling.causal_conv1d_fn"};
    b.call(p + ".conv1d", b.next_id, b.next_id + 1, 12);
    b.next_id += 2;
  }
  b.linear(p + ".in_proj_qkv", 2048, 8192);
  b.call(p + ".in_proj_qkv", b.next_id, b.next_id + 1, 12);
  b.next_id += 2;
  b.g.params.push_back({p + ".in_proj_qkv", "weight", {8192, 2048}, 8192 * 2048});
  return b;
}

TEST(Plan, FunctionSeamsAreSeatedAtHostPrecisionUnderEveryScheme) {
  for (const char* scheme : {"w8a16_decode", "w4a8_decode", "w8a8_all"}) {
    PlanOptions o;
    o.scheme = scheme;
    o.structures = {"gated_delta_core", "causal_conv"};
    const Plan p = plan(linear_attention(RecurrenceForm::gated_delta).g, catalog(), o, hub());
    ASSERT_EQ(p.seats.size(), 2u) << explain(p);
    for (const SeatPlan& s : p.seats) {
      EXPECT_TRUE(s.form.host);
      EXPECT_EQ(s.form.describe(), "host precision");
      EXPECT_EQ(s.package, "flashrt/recurrent");
      EXPECT_EQ(s.band_min, 1);
      EXPECT_EQ(s.band_max, kUnboundedRows);
      EXPECT_TRUE(s.slots.empty());
      if (s.op == OpKind::gated_delta) {
        EXPECT_EQ(s.site, "layers.0.linear_attn");
        EXPECT_EQ(s.impl, "gated_delta_f32");
        EXPECT_EQ(s.seam.dims.at("v_heads"), 32);
        EXPECT_EQ(s.seam.dims.at("k_dim"), 128);
      } else {
        EXPECT_EQ(s.op, OpKind::causal_conv1d);
        EXPECT_EQ(s.site, "layers.0.linear_attn.conv1d");
        EXPECT_EQ(s.activation, Activation::silu);
        EXPECT_EQ(s.seam.dims.at("taps"), 4);
      }
    }
    EXPECT_NE(explain(p).find("gated_delta_core q/k 16x128, v 32x128 -> gated_delta_f32"),
              std::string::npos)
        << explain(p);
  }
}

TEST(Plan, SchemeNoneKeepsTheFunctionSeamsWithTheHost) {
  PlanOptions o;
  o.scheme = "none";
  o.structures = {"gated_delta_core", "causal_conv"};
  const Plan p = plan(linear_attention(RecurrenceForm::gated_delta).g, catalog(), o, hub());
  EXPECT_TRUE(p.seats.empty()) << explain(p);
  ASSERT_EQ(p.keep_host.size(), 2u) << explain(p);
  for (const auto& [site, why] : p.keep_host)
    EXPECT_NE(why.find("scheme 'none' seats nothing"), std::string::npos) << why;
}

TEST(Plan, AnotherRecurrenceOrConvolutionIsRefusedByFormAndShape) {
  PlanOptions o;
  o.scheme = "w8a16_decode";
  o.structures = {"gated_delta_core", "causal_conv"};
  const Plan p = plan(linear_attention(RecurrenceForm::other).g, catalog(), o, hub());
  ASSERT_EQ(p.refused.size(), 1u) << explain(p);
  EXPECT_EQ(p.refused[0].first, "layers.0.linear_attn");
  EXPECT_NE(p.refused[0].second.find("gated_delta_core: form 'other' outside {gated_delta} (q/k "
                                     "16x128, v 32x128): it differs by 0.5 on a probe"),
            std::string::npos)
      << p.refused[0].second;
  // A grouped (not depthwise) convolution, and one no function was handed.
  const Plan grouped =
      plan(linear_attention(RecurrenceForm::gated_delta, true, 4).g, catalog(), o, hub());
  bool named = false;
  for (const auto& [site, why] : grouped.refused)
    named |= site == "layers.0.linear_attn.conv1d" &&
             why.find("a convolution of 4 groups over 8192 channels") != std::string::npos;
  EXPECT_TRUE(named) << explain(grouped);
  const Plan never =
      plan(linear_attention(RecurrenceForm::gated_delta, false).g, catalog(), o, hub());
  named = false;
  for (const auto& [site, why] : never.refused)
    named |= site == "layers.0.linear_attn.conv1d" &&
             why.find("8192 channels x 4 taps never called") != std::string::npos;
  EXPECT_TRUE(named) << explain(never);
}

TEST(Plan, ARecurrenceDecisionCoversNoWeightBelowIt) {
  // A refused rule at the module must not account for the projections inside it.
  PlanOptions o;
  o.scheme = "w8a16_decode";
  o.structures = {};
  GraphBuilder b = linear_attention(RecurrenceForm::other);
  b.module("layers.0.linear_attn.adapter", ModuleKind::module);  // described by nothing
  b.g.params.push_back({"layers.0.linear_attn.adapter", "lora_a", {1024, 1024}, 1024 * 1024});
  const Plan p = plan(b.g, catalog(), o, hub());
  bool named = false;
  for (const auto& [site, why] : p.refused)
    named |= site == "layers.0.linear_attn.adapter" &&
             why.find("no catalog structure describes it") != std::string::npos;
  EXPECT_TRUE(named) << explain(p, true);
}

std::vector<SiteReason>::const_iterator find_site(const std::vector<SiteReason>& rs,
                                                  const std::string& site) {
  return std::find_if(rs.begin(), rs.end(), [&](const SiteReason& r) { return r.first == site; });
}

// A decoder layer's norms (measured `form`, the module's epsilon) and its attention module as the
// door saw it call the host's attention interface (`attention`).
GraphBuilder decoder_layer(NormForm form, double eps, bool affine, AttentionForm attention) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  const std::string p = "layers.0";
  for (const std::string norm : {"input_layernorm", "post_attention_layernorm"}) {
    HostModule& n = b.module(p + "." + norm, ModuleKind::norm);
    n.in_features = n.out_features = 1024;
    n.norm.form = form;
    n.norm.eps = eps;
    n.norm.affine = affine;
    b.call(p + "." + norm, b.next_id, b.next_id + 1, 1);
    b.next_id += 2;
  }
  HostModule& a = b.module(p + ".self_attn", ModuleKind::attention);
  a.attention.form = attention;
  a.attention.heads = 16;
  a.attention.kv_heads = 8;
  a.attention.head_dim = 128;
  a.attention.implementation = "sdpa";
  if (attention == AttentionForm::softcapped) a.attention.softcap = 50;
  if (attention == AttentionForm::other) a.attention.other = "its calls pass s_aux";
  b.call(p + ".self_attn", b.next_id, b.next_id + 1, 1);
  b.next_id += 2;
  b.linear(p + ".self_attn.q_proj", 1024, 2048);
  b.call(p + ".self_attn.q_proj", b.next_id, b.next_id + 1, 1);
  b.next_id += 2;
  b.g.params.push_back({p + ".self_attn.q_proj", "weight", {2048, 1024}, 2048 * 1024});
  return b;
}

TEST(Plan, NormsAndAttentionAreSeatedAtHostPrecisionWhereTheirFormIsOneTheOpsCompute) {
  PlanOptions o;
  o.scheme = "w8a16_decode";
  o.structures = {"norm_fused", "attention_core"};
  const Plan p =
      plan(decoder_layer(NormForm::rms_one_plus, 1e-6, true, AttentionForm::softcapped).g,
           catalog(), o, hub());
  ASSERT_EQ(p.seats.size(), 3u) << explain(p);
  for (const SeatPlan& s : p.seats) {
    EXPECT_TRUE(s.form.host);
    EXPECT_EQ(s.package, "flashrt/decode");
    if (s.op == OpKind::rmsnorm) {
      EXPECT_EQ(s.impl, "rmsnorm_f32");
      EXPECT_EQ(s.seam.norm.form, NormForm::rms_one_plus);
      EXPECT_DOUBLE_EQ(s.seam.norm.eps, 1e-6);
      ASSERT_EQ(s.slots.count("weight"), 1u);  // the module's own weight, copied at bind
      EXPECT_EQ(s.slots.at("weight").module, s.site);
      EXPECT_EQ(s.band_max, kUnboundedRows);
    } else {
      EXPECT_EQ(s.op, OpKind::attention);
      EXPECT_EQ(s.site, "layers.0.self_attn");
      EXPECT_EQ(s.band_max, 1);  // decode rows: a prompt's call is the host's
      EXPECT_DOUBLE_EQ(s.seam.attention.softcap, 50);
      EXPECT_TRUE(s.slots.empty());
    }
  }
  const std::string text = explain(p);
  EXPECT_NE(text.find("norm_fused [1024] rms_one_plus, eps 1e-06 -> rmsnorm_f32"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("attention_core 16 heads / 8 kv of 128, softcap 50 -> attention_f32"),
            std::string::npos)
      << text;
  // The attention module's decision covers none of its projections: q_proj is accounted apart.
  o.structures = {};
  const Plan all =
      plan(decoder_layer(NormForm::rms, 1e-5, true, AttentionForm::softmax).g, catalog(), o, hub());
  EXPECT_EQ(find_site(all.refused, "layers.0.self_attn.q_proj"), all.refused.end()) << explain(all);
  bool q_seated = false;
  for (const SeatPlan& s : all.seats) q_seated |= s.site == "layers.0.self_attn.q_proj";
  EXPECT_TRUE(q_seated) << explain(all);
}

TEST(Plan, AnEnginesPagedAttentionTakesThePagedStructureAndTheDenseOneNever) {
  PlanOptions o;
  o.scheme = "w8a16_decode";
  o.structures = {"attention_core", "attention_paged"};
  // A transformers module (its calls hand k and v): attention_core, never attention_paged.
  const Plan dense =
      plan(decoder_layer(NormForm::rms, 1e-5, true, AttentionForm::softmax).g, catalog(), o, hub());
  for (const SeatPlan& s : dense.seats) {
    if (s.site == "layers.0.self_attn") {
      EXPECT_EQ(s.seam.structure, "attention_core");
    }
  }
  // A serving engine's layer over its pool of slots, in bf16: attention_paged, op paged_attention.
  GraphBuilder b = decoder_layer(NormForm::rms, 1e-5, true, AttentionForm::softmax);
  for (HostModule& m : b.g.modules)
    if (m.kind == ModuleKind::attention) m.attention.cache = AttentionCache::paged;
  for (HostCall& c : b.g.calls)
    if (c.path == "layers.0.self_attn") c.dtype = DType::bf16;
  const Plan paged = plan(b.g, catalog(), o, hub());
  bool seated = false;
  for (const SeatPlan& s : paged.seats) {
    if (s.site != "layers.0.self_attn") continue;
    seated = true;
    EXPECT_EQ(s.seam.structure, "attention_paged");
    EXPECT_EQ(s.op, OpKind::paged_attention);
    EXPECT_EQ(s.impl, "paged_attention_bf16");
    EXPECT_EQ(s.band_max, 1);
  }
  EXPECT_TRUE(seated) << explain(paged);
  // Its form read as other (a sliding window, say): refused by form and shape, not silent.
  for (HostModule& m : b.g.modules)
    if (m.kind == ModuleKind::attention) {
      m.attention.form = AttentionForm::other;
      m.attention.other = "a sliding window of 4096";
    }
  const Plan other = plan(b.g, catalog(), o, hub());
  const auto it = find_site(other.refused, "layers.0.self_attn");
  ASSERT_NE(it, other.refused.end()) << explain(other);
  EXPECT_NE(it->second.find("attention_paged: form 'other' outside {softmax, softcapped} (16 heads "
                            "/ 8 kv of 128): a sliding window of 4096"),
            std::string::npos)
      << it->second;
}

TEST(Plan, AModulesOwnSequenceAttentionTakesTheSequenceStructureInBf16Only) {
  PlanOptions o;
  o.scheme = "w8a8_dynamic";
  o.structures = {"attention_core", "attention_paged", "attention_sequence"};
  // A diffusion transformer's attention module: its processor hands torch's function whole
  // sequences (cache none), in bf16: attention_sequence on flashrt/gemm, every query count.
  GraphBuilder b = decoder_layer(NormForm::rms, 1e-5, true, AttentionForm::softmax);
  for (HostModule& m : b.g.modules)
    if (m.kind == ModuleKind::attention) m.attention.cache = AttentionCache::none;
  for (HostCall& c : b.g.calls)
    if (c.path == "layers.0.self_attn") c.dtype = DType::bf16;
  const Plan sequence = plan(b.g, catalog(), o, hub());
  // Its rung pays on flashrt/gemm's amx build only: on any other the host keeps it, by name.
  const std::string& build = hub().resolve("flashrt/gemm").chosen;
  if (build.substr(build.rfind('-') + 1) != "amx") {
    const auto it = find_site(sequence.refused, "layers.0.self_attn");
    ASSERT_NE(it, sequence.refused.end()) << explain(sequence);
    EXPECT_NE(it->second.find("flashrt/gemm's build here is " + build +
                              "; this rung pays on its amx build only"),
              std::string::npos)
        << it->second;
    for (const SeatPlan& s : sequence.seats) EXPECT_NE(s.site, "layers.0.self_attn");
    return;
  }
  bool seated = false;
  for (const SeatPlan& s : sequence.seats) {
    if (s.site != "layers.0.self_attn") continue;
    seated = true;
    EXPECT_EQ(s.seam.structure, "attention_sequence");
    EXPECT_EQ(s.op, OpKind::sequence_attention);
    EXPECT_EQ(s.impl, "sequence_attention_bf16");
    EXPECT_EQ(s.package, "flashrt/gemm");
    EXPECT_EQ(s.band_max, kUnboundedRows);  // a whole sequence's queries in one call
    EXPECT_TRUE(s.slots.empty());
  }
  EXPECT_TRUE(seated) << explain(sequence);
  // The same module in f32: refused by dtype, named; never the dense or paged structures.
  for (HostCall& c : b.g.calls)
    if (c.path == "layers.0.self_attn") c.dtype = DType::f32;
  const Plan f32 = plan(b.g, catalog(), o, hub());
  for (const SeatPlan& s : f32.seats) EXPECT_NE(s.site, "layers.0.self_attn");
  const auto it = find_site(f32.refused, "layers.0.self_attn");
  ASSERT_NE(it, f32.refused.end()) << explain(f32);
  EXPECT_NE(it->second.find("attention_sequence 16 heads / 8 kv of 128: activations f32 in the "
                            "observed forward; impls take bf16"),
            std::string::npos)
      << it->second;
}

TEST(Plan, NormsAndAttentionOutsideTheirFormsAreRefusedByFormAndShape) {
  PlanOptions o;
  o.scheme = "w8a16_decode";
  o.structures = {"norm_fused", "attention_core"};
  const Plan layer =
      plan(decoder_layer(NormForm::layer, 1e-5, true, AttentionForm::other).g, catalog(), o, hub());
  EXPECT_TRUE(layer.seats.empty()) << explain(layer);
  ASSERT_EQ(layer.refused.size(), 3u) << explain(layer);
  const auto why = [&](const Plan& p, const std::string& site) {
    const auto it = find_site(p.refused, site);
    return it == p.refused.end() ? std::string("(not refused)") : it->second;
  };
  EXPECT_NE(why(layer, "layers.0.input_layernorm")
                .find("norm_fused: form 'layer' outside {rms, rms_one_plus} ([1024] layer"),
            std::string::npos)
      << explain(layer);
  EXPECT_NE(why(layer, "layers.0.self_attn")
                .find("attention_core: form 'other' outside {softmax, softcapped} (16 heads / 8 "
                      "kv of 128): its calls pass s_aux"),
            std::string::npos)
      << explain(layer);
  // A norm without a weight of its own (its epsilon never read) is not one the seat stands for.
  const Plan bare =
      plan(decoder_layer(NormForm::rms, 0, false, AttentionForm::softmax).g, catalog(), o, hub());
  EXPECT_NE(
      why(bare, "layers.0.post_attention_layernorm").find("a norm without a weight of its own"),
      std::string::npos)
      << explain(bare);
  // The host-only baseline seats none of them.
  o.scheme = "none";
  const Plan none =
      plan(decoder_layer(NormForm::rms, 1e-6, true, AttentionForm::softmax).g, catalog(), o, hub());
  EXPECT_TRUE(none.seats.empty()) << explain(none);
  EXPECT_EQ(none.keep_host.size(), 3u) << explain(none);
}

// A model's rotary module whose tables the door saw a rotary function called with, in `form`.
GraphBuilder rotary_host(RotaryForm form) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  HostModule& r = b.module("model.rotary_emb", ModuleKind::rotary);
  r.rotary.form = form;
  r.rotary.heads = 16;
  r.rotary.kv_heads = 8;
  r.rotary.head_dim = 128;
  r.rotary.functions = {"transformers.models.qwen3.modeling_qwen3.apply_rotary_pos_emb"};
  if (form == RotaryForm::other) r.rotary.other = "its calls' tables are 64 wide (partial)";
  for (int64_t rows : {7, 1}) {
    b.call("model.rotary_emb", b.next_id, b.next_id + 1, rows);
    b.next_id += 2;
  }
  return b;
}

TEST(Plan, ARotaryIsSeatedAtHostPrecisionForEveryTokenCountWhereItRotatesHalves) {
  PlanOptions o;
  o.scheme = "w8a16_decode";
  o.structures = {"rotary_embed"};
  const Plan p = plan(rotary_host(RotaryForm::half).g, catalog(), o, hub());
  ASSERT_EQ(p.seats.size(), 1u) << explain(p);
  const SeatPlan& s = p.seats[0];
  EXPECT_TRUE(s.form.host);
  EXPECT_EQ(s.op, OpKind::rotary);
  EXPECT_EQ(s.impl, "rotary_f32");
  EXPECT_EQ(s.site, "model.rotary_emb");
  EXPECT_EQ(s.band_min, 1);
  EXPECT_EQ(s.band_max, kUnboundedRows);  // a prompt's rows and a decode row alike
  EXPECT_EQ(s.seam.dims.at("kv_heads"), 8);
  EXPECT_NE(explain(p).find("rotary_embed q 16 / k 8 heads of 128 -> rotary_f32"),
            std::string::npos)
      << explain(p);
  // Interleaved pairs, and a form the door could not name, are refused by form and shape; the
  // scheme none keeps it with the host.
  for (RotaryForm form : {RotaryForm::interleaved, RotaryForm::other}) {
    const Plan r = plan(rotary_host(form).g, catalog(), o, hub());
    EXPECT_TRUE(r.seats.empty()) << explain(r);
    ASSERT_EQ(r.refused.size(), 1u) << explain(r);
    const std::string want = std::string("rotary_embed: form '") + name_of(form) +
                             "' outside {half} (q 16 / k 8 heads of 128)";
    EXPECT_NE(r.refused[0].second.find(want), std::string::npos) << r.refused[0].second;
    if (form == RotaryForm::other) {
      EXPECT_NE(r.refused[0].second.find("64 wide (partial)"), std::string::npos);
    }
  }
  o.scheme = "none";
  const Plan none = plan(rotary_host(RotaryForm::half).g, catalog(), o, hub());
  EXPECT_TRUE(none.seats.empty()) << explain(none);
}

// A pre-norm decoder layer as the door measured it: its norms, attention module (q/k/v/o and
// per-head q/k norms), feed-forward and the model's rotary, each called once for a decode row;
// the layer's composition `form`.
GraphBuilder block_host(BlockForm form) {
  GraphBuilder b;
  b.module("", ModuleKind::module);
  HostModule& r = b.module("model.rotary_emb", ModuleKind::rotary);
  r.rotary.form = RotaryForm::half;
  r.rotary.heads = 16;
  r.rotary.kv_heads = 8;
  r.rotary.head_dim = 128;
  b.call_fresh("model.rotary_emb");
  const std::string p = "model.layers.0";
  HostModule& layer = b.module(p, ModuleKind::block);
  layer.block.form = form;
  layer.block.hidden = 1024;
  if (form == BlockForm::other)
    layer.block.other =
        "model.layers.0.post_attention_layernorm does not read x + "
        "model.layers.0.self_attn's output (a scaled residual)";
  else
    layer.block = {form,
                   p + ".input_layernorm",
                   p + ".self_attn",
                   p + ".post_attention_layernorm",
                   p + ".mlp",
                   p + ".self_attn.q_proj",
                   p + ".self_attn.k_proj",
                   p + ".self_attn.v_proj",
                   p + ".self_attn.o_proj",
                   p + ".self_attn.q_norm",
                   p + ".self_attn.k_norm",
                   "model.rotary_emb",
                   1024,
                   ""};
  b.call_fresh(p);
  const auto norm = [&](const std::string& path, int64_t width) {
    HostModule& n = b.module(path, ModuleKind::norm);
    n.in_features = n.out_features = width;
    n.norm.form = NormForm::rms;
    n.norm.eps = 1e-6;
    b.call_fresh(path);
  };
  norm(p + ".input_layernorm", 1024);
  HostModule& a = b.module(p + ".self_attn", ModuleKind::attention);
  a.attention.form = AttentionForm::softmax;
  a.attention.heads = 16;
  a.attention.kv_heads = 8;
  a.attention.head_dim = 128;
  a.attention.scale = 1.0 / std::sqrt(128.0);
  b.call_fresh(p + ".self_attn");
  const int64_t x = b.next_id++;
  for (const auto& [name, out] : {std::pair{"q_proj", 2048}, {"k_proj", 1024}, {"v_proj", 1024}}) {
    b.linear(p + ".self_attn." + name, 1024, out);
    b.call(p + ".self_attn." + name, x, b.next_id++);
  }
  norm(p + ".self_attn.q_norm", 128);
  norm(p + ".self_attn.k_norm", 128);
  b.linear(p + ".self_attn.o_proj", 2048, 1024);
  b.call_fresh(p + ".self_attn.o_proj");
  norm(p + ".post_attention_layernorm", 1024);
  b.gated_mlp(p + ".mlp", 1024, 3072, Activation::silu);
  return b;
}

TEST(Plan, ADecoderLayerWhoseEveryPartIsSeatedIsOneBlockOverTheirSeats) {
  PlanOptions o;
  o.scheme = "w8a16_decode";
  const Plan p = plan(block_host(BlockForm::pre_norm_residual).g, catalog(), o, hub());
  const auto block = std::find_if(p.seats.begin(), p.seats.end(),
                                  [](const SeatPlan& s) { return s.op == OpKind::block; });
  ASSERT_NE(block, p.seats.end()) << explain(p);
  EXPECT_EQ(block->site, "model.layers.0");
  EXPECT_EQ(block->impl, "block_f32");
  EXPECT_TRUE(block->form.host);
  EXPECT_TRUE(block->package.empty());  // it runs its parts' seats, no op of its own
  EXPECT_EQ(block->band_min, 1);
  EXPECT_EQ(block->band_max, 16);  // the projections' decode band (attention's is per token)
  const std::map<std::string, std::string> want = {
      {"block", "model.layers.0"},
      {"input_norm", "model.layers.0.input_layernorm"},
      {"post_norm", "model.layers.0.post_attention_layernorm"},
      {"ffn", "model.layers.0.mlp"},
      {"attention", "model.layers.0.self_attn"},
      {"o", "model.layers.0.self_attn.o_proj"},
      {"q_norm", "model.layers.0.self_attn.q_norm"},
      {"k_norm", "model.layers.0.self_attn.k_norm"},
      {"rotary", "model.rotary_emb"},
      {"q", "model.layers.0.self_attn.q_proj"},
      {"k", "model.layers.0.self_attn.k_proj"},
      {"v", "model.layers.0.self_attn.v_proj"}};
  EXPECT_EQ(block->seam.nodes, want);
  EXPECT_EQ(block->seam.attention.heads, 16);
  EXPECT_NE(explain(p).find("model.layers.0  decoder_block hidden 1024 -> block_f32"),
            std::string::npos)
      << explain(p);
  EXPECT_TRUE(p.refused.empty()) << explain(p);

  // A part left with the host keeps the layer's own forward, naming the part; its weights stay
  // accounted by their own decisions.
  o.structures = {"decoder_block", "norm_fused", "rotary_embed", "linear_proj", "decoder_ffn"};
  const Plan partial = plan(block_host(BlockForm::pre_norm_residual).g, catalog(), o, hub());
  const auto kept = find_site(partial.keep_host, "model.layers.0");
  ASSERT_NE(kept, partial.keep_host.end()) << explain(partial);
  EXPECT_NE(kept->second.find("decoder_block hidden 1024: not every part has a seat (attention "
                              "model.layers.0.self_attn)"),
            std::string::npos)
      << kept->second;
  for (const SeatPlan& s : partial.seats) EXPECT_NE(s.op, OpKind::block);
  // The host-only baseline keeps it with the others.
  o.structures = {};
  o.scheme = "none";
  const Plan none = plan(block_host(BlockForm::pre_norm_residual).g, catalog(), o, hub());
  ASSERT_NE(find_site(none.keep_host, "model.layers.0"), none.keep_host.end()) << explain(none);
}

TEST(Plan, ALayerOfAnotherCompositionIsRefusedByFormAndItsPartsKeepTheirSeats) {
  PlanOptions o;
  o.scheme = "w8a16_decode";
  const Plan p = plan(block_host(BlockForm::other).g, catalog(), o, hub());
  const auto refused = find_site(p.refused, "model.layers.0");
  ASSERT_NE(refused, p.refused.end()) << explain(p);
  EXPECT_EQ(refused->second,
            "decoder_block: form 'other' outside {pre_norm_residual} (hidden 1024): "
            "model.layers.0.post_attention_layernorm does not read x + model.layers.0.self_attn's "
            "output (a scaled residual)");
  int parts = 0;
  for (const SeatPlan& s : p.seats) {
    EXPECT_NE(s.op, OpKind::block);
    parts += s.site.rfind("model.layers.0.", 0) == 0;
  }
  EXPECT_EQ(parts, 10) << explain(p);  // norms x4, q/k/v/o, attention, mlp
  // The refusal covers no weight below the layer: nothing there is refused for want of a
  // structure.
  for (const auto& [site, why] : p.refused) EXPECT_EQ(site, "model.layers.0") << why;
}

// The one judgment of a router both routed plans share: the form the core computes, over the
// bank's experts and width, k within what a kernel routes.
TEST(Plan, ARouterIsJudgedByItsMeasuredFormShapeAndTopK) {
  HostModule m;
  m.path = "model.layers.0.mlp.gate";
  m.type_name = "Router";
  m.router = {RouterForm::softmax_topk_renormalised, 8, 64, 2, ""};
  EXPECT_EQ(router_refusal(m, 8, 64), "");
  m.router.form = RouterForm::softmax_topk;
  EXPECT_EQ(router_refusal(m, 8, 64), "");

  EXPECT_EQ(router_refusal(m, 16, 64),
            "model.layers.0.mlp.gate (Router) routes over [8x64]; the bank holds 16 experts of "
            "width 64");
  EXPECT_NE(router_refusal(m, 8, 32).find("routes over [8x64]"), std::string::npos);
  m.router.top_k = 0;
  EXPECT_EQ(router_refusal(m, 8, 64),
            "model.layers.0.mlp.gate (Router) picks 0 of 8 experts; the core routes 1..8 of them "
            "a row");
  m.router.top_k = 9;
  EXPECT_NE(router_refusal(m, 8, 64).find("picks 9 of 8"), std::string::npos);
  m.router = {RouterForm::other, 8, 64, 2, "sigmoid scores"};
  EXPECT_EQ(router_refusal(m, 8, 64),
            "model.layers.0.mlp.gate (Router) does not route as the top-k of softmax(x W^T): "
            "sigmoid scores");
  m.router = {};
  EXPECT_EQ(router_refusal(m, 8, 64),
            "the door measured no routing at model.layers.0.mlp.gate "
            "(Router)");
}

}  // namespace
}  // namespace frt

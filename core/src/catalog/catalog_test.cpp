#include "flashrt/catalog.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "flashrt/decode_plan.h"
#include "flashrt/errors.h"
#include "flashrt/hub.h"
#include "flashrt/plan.h"

namespace frt {
namespace {

namespace fs = std::filesystem;

const std::string kCatalogDir = FRT_TEST_CATALOG_DIR;

// A small valid spec; each error test breaks exactly one thing in it.
const std::string kValid = R"(name: demo
version: 1
kind: region
description: a test seam
dims:
  rows: {min: 1, max: 16, decode_band: true}
  k: {min: 1}
  n: {min: 1, multiple_of: 16}
boundary:
  inputs:
    x: {shape: [rows, k], dtypes: [f32, bf16]}
  outputs:
    y: {shape: [rows, n], dtype_of: x}
slots:
  weight: {shape: [n, k], dtypes: [f32], required: true}
points:
  x: input
  y: output
gates:
  parity: {output: values, pass: 0.999, warn: 0.995}
  latency: {min_speedup: 1.02}
match:
  priority: 0
  site: node
  nodes:
    proj: {kind: linear, weight: weight}
reference: "y = x @ weight.T"
)";

// The same seam with an activation after the projection: a pattern with an activation node.
const std::string kWithActivation = R"yaml(name: demo
version: 1
kind: region
description: a test seam with an activation
dims:
  rows: {min: 1, max: 16, decode_band: true}
  k: {min: 1}
  n: {min: 1}
boundary:
  inputs:
    x: {shape: [rows, k], dtypes: [f32, bf16]}
  outputs:
    y: {shape: [rows, n], dtype_of: x}
slots:
  weight: {shape: [n, k], dtypes: [f32], required: true}
attributes:
  activation: [silu, gelu]
points:
  x: input
  y: output
gates:
  parity: {output: values, pass: 0.999, warn: 0.995}
  latency: {min_speedup: 1.02}
match:
  site: parent
  nodes:
    proj: {kind: linear, weight: weight}
    act: {kind: activation, attribute: activation}
  flow:
    - feeds: [proj, act]
reference: "y = act(x @ weight.T)"
)yaml";

// Valid policy files for the demo structure; each policy error test breaks one thing in one.
const std::string kSchemes = R"(forms:
  int8: {format: int8_channel, tag: w8a16}
schemes:
  none:
    description: every seam stays at host precision
    formats: {}
  w8:
    description: int8 weights
    requires: [flashrt/linear]
    formats: {demo: int8}
auto: [w8, none]
keep_host:
  min_seat_weights: 0
)";

const std::string kLadders = R"(ladders:
  demo:
    - {impl: linear, package: flashrt/linear, op: linear}
)";

const std::string kGates = R"(output_kinds:
  values: {metric: cosine, pass: 0.999, warn: 0.995}
  distribution: {metric: top1_agreement, pass: 0.95, warn: 0.85}
)";

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "fixture text '" << from << "' not found";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

bool is_hex16(const std::string& s) {
  return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

class CatalogFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("frt_catalog_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `file` is relative to the catalog dir ("structures/demo.yaml", "schemes.yaml").
  void write(const std::string& file, const std::string& text) {
    fs::create_directories((dir_ / file).parent_path());
    std::ofstream(dir_ / file, std::ios::binary) << text;
  }

  // The demo structure and a valid policy for it.
  void write_valid_catalog() {
    write("structures/demo.yaml", kValid);
    write("schemes.yaml", kSchemes);
    write("ladders.yaml", kLadders);
    write("gates.yaml", kGates);
  }

  std::string load_error() {
    try {
      Catalog::load(dir_.string());
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    ADD_FAILURE() << "Catalog::load accepted the spec";
    return {};
  }

  // Loads the catalog and expects the error to name `file`, the field and the problem.
  void expect_error_in(const std::string& file, const std::string& field, const std::string& what) {
    const std::string msg = load_error();
    EXPECT_NE(msg.find((dir_ / file).string() + ": "), std::string::npos)
        << "file '" << file << "' in: " << msg;
    EXPECT_NE(msg.find(field), std::string::npos) << "field '" << field << "' in: " << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << "'" << what << "' in: " << msg;
  }

  // Loads `text` as structures/demo.yaml and expects the error to name the file, the field and
  // the problem.
  void expect_error(const std::string& text, const std::string& field, const std::string& what) {
    write("structures/demo.yaml", text);
    expect_error_in("structures/demo.yaml", field, what);
  }

  // Writes the valid catalog with `file` replaced by `text`, and expects the error there.
  void expect_policy_error(const std::string& file, const std::string& text,
                           const std::string& field, const std::string& what) {
    write_valid_catalog();
    write(file, text);
    expect_error_in(file, field, what);
  }

  std::string digest_of(const std::string& text) {
    write("structures/demo.yaml", text);
    return Catalog::load(dir_.string()).get("demo").digest;
  }

  fs::path dir_;
};

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The shipped catalog may gain structures; these tests look at the three they name.
const std::vector<std::string> kShipped = {"decoder_ffn", "linear_proj", "lm_head"};

TEST(Catalog, ShippedCatalogHoldsTheThreeStructures) {
  const Catalog c = Catalog::load(kCatalogDir);
  EXPECT_EQ(c.dir(), kCatalogDir);
  const std::vector<std::string> names = c.names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  std::set<std::string> digests;
  for (const std::string& name : kShipped) {
    ASSERT_TRUE(contains(names, name)) << name;
    const StructureSpec& s = c.get(name);
    EXPECT_EQ(s.name, name);
    EXPECT_EQ(s.version, 1);
    EXPECT_EQ(s.kind, "region");
    EXPECT_FALSE(s.reference.empty());
    EXPECT_TRUE(is_hex16(s.digest)) << s.digest;
    digests.insert(s.digest);
    const DimSpec* rows = s.dim("rows");
    ASSERT_NE(rows, nullptr) << name;
    EXPECT_TRUE(rows->decode_band);
    EXPECT_EQ(rows->min, 1);
    EXPECT_EQ(rows->max, 16);
    EXPECT_DOUBLE_EQ(s.gate.min_speedup, 1.02);
    ASSERT_EQ(s.outputs.size(), 1u);
    EXPECT_EQ(s.outputs[0].dtype_of, "x");
    EXPECT_EQ(s.outputs[0].dtypes, (std::vector<DType>{DType::f32, DType::bf16}));
    EXPECT_FALSE(s.match.nodes.empty()) << name;
  }
  EXPECT_EQ(digests.size(), kShipped.size());
}

TEST(Catalog, ShippedSpecsSayWhatTheBriefSays) {
  const Catalog c = Catalog::load(kCatalogDir);

  const StructureSpec& lin = c.get("linear_proj");
  ASSERT_NE(lin.slot("weight"), nullptr);
  EXPECT_EQ(lin.slot("weight")->shape, (std::vector<std::string>{"out_features", "in_features"}));
  ASSERT_NE(lin.slot("bias"), nullptr);
  EXPECT_FALSE(lin.slot("bias")->required);
  EXPECT_EQ(lin.slot("missing"), nullptr);
  EXPECT_EQ(lin.gate.kind, OutputKind::values);
  EXPECT_DOUBLE_EQ(lin.gate.pass, 0.999);
  EXPECT_DOUBLE_EQ(lin.gate.warn, 0.995);
  EXPECT_FALSE(lin.tied_allowed);
  EXPECT_EQ(lin.match.site, SiteKind::node);
  ASSERT_EQ(lin.match.nodes.size(), 1u);
  EXPECT_EQ(lin.match.nodes[0].weight_slot, "weight");
  EXPECT_EQ(lin.match.nodes[0].bias_slot, "bias");
  EXPECT_EQ(lin.match.nodes[0].out_dim, "out_features");
  EXPECT_EQ(lin.match.nodes[0].in_dim, "in_features");

  const StructureSpec& ffn = c.get("decoder_ffn");
  for (const char* slot : {"gate", "up", "down"}) {
    ASSERT_NE(ffn.slot(slot), nullptr) << slot;
    EXPECT_TRUE(ffn.slot(slot)->required);
  }
  EXPECT_EQ(ffn.slot("bias"), nullptr);  // bias-free: a biased FFN is another seam
  EXPECT_EQ(ffn.slot("down")->shape, (std::vector<std::string>{"hidden", "intermediate"}));
  EXPECT_EQ(ffn.attributes.at("activation"), (std::vector<std::string>{"silu", "gelu_tanh"}));
  using Points = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(ffn.points, (Points{{"x", "input"}, {"h", "internal"}, {"y", "output"}}));
  EXPECT_EQ(ffn.boundary_excludes, (std::vector<std::string>{"pre_norm", "residual_add"}));
  EXPECT_EQ(ffn.match.site, SiteKind::parent);
  EXPECT_EQ(ffn.match.nodes.size(), 4u);
  ASSERT_NE(ffn.match.node("act"), nullptr);
  EXPECT_EQ(ffn.match.node("act")->kind, NodeKind::activation);
  EXPECT_EQ(ffn.match.node("act")->attribute, "activation");
  ASSERT_EQ(ffn.match.flow.size(), 3u);
  EXPECT_EQ(ffn.match.flow[1].kind, FlowKind::feeds);
  EXPECT_EQ(ffn.match.flow[1].a, "gate");
  EXPECT_EQ(ffn.match.flow[1].b, "act");

  const StructureSpec& head = c.get("lm_head");
  EXPECT_TRUE(head.tied_allowed);
  EXPECT_EQ(head.slot("weight")->shape, (std::vector<std::string>{"vocab", "hidden"}));
  EXPECT_EQ(head.gate.kind, OutputKind::distribution);
  EXPECT_DOUBLE_EQ(head.gate.pass, 0.95);
  EXPECT_DOUBLE_EQ(head.gate.warn, 0.85);
  EXPECT_TRUE(head.match.always_claims);
  EXPECT_TRUE(head.match.nodes[0].output_head);
  EXPECT_GT(head.match.priority, ffn.match.priority);
  EXPECT_GT(ffn.match.priority, lin.match.priority);
}

TEST(Catalog, ShippedPolicySaysWhatTheFilesSay) {
  const Catalog c = Catalog::load(kCatalogDir);
  const std::vector<Rung>& ffn = c.ladder("decoder_ffn");
  ASSERT_EQ(ffn.size(), 3u);
  EXPECT_EQ(ffn[0].package, "flashrt/ffn");
  EXPECT_EQ(ffn[0].op, OpKind::gated_ffn);
  EXPECT_FALSE(ffn[0].per_node);
  EXPECT_EQ(ffn[1].impl, "ffn_as_projections");
  EXPECT_EQ(ffn[1].op, OpKind::linear);
  EXPECT_TRUE(ffn[1].per_node);
  EXPECT_EQ(c.rung_field("decoder_ffn", 1), kCatalogDir + "/ladders.yaml: ladders.decoder_ffn[1]");
  EXPECT_EQ(ffn[2].package, "flashrt/gemm");  // the w8a8 GEMM, per projection
  EXPECT_TRUE(ffn[2].per_node);
  EXPECT_TRUE(c.ladder("no_such_structure").empty());

  const SchemePolicy& p = c.schemes();
  EXPECT_EQ(p.auto_order, (std::vector<std::string>{"w8a16_decode", "none"}));
  EXPECT_EQ(p.gated_auto.front(), "w8a16_decode");
  for (const std::string& name : p.gated_auto) EXPECT_TRUE(p.schemes.count(name)) << name;
  EXPECT_EQ(p.min_seat_weights, 65536);
  EXPECT_EQ(p.forms.at("int4_g32").format, WeightFormat::int4_group);
  EXPECT_EQ(p.forms.at("int4_g32").group, 32);
  EXPECT_EQ(p.forms.at("int4_g32").describe(), "int4 g32 symmetric");
  EXPECT_EQ(p.forms.at("int8").describe(), "int8 per-channel");
  EXPECT_EQ(p.forms.at("int8").rows_min, 0);  // the structure's decode band
  // The GEMM form serves many-row calls: its own band, from a min, unbounded.
  EXPECT_EQ(p.forms.at("int8_rows").format, WeightFormat::int8_gemm);
  EXPECT_GT(p.forms.at("int8_rows").rows_min, 16);
  EXPECT_EQ(p.forms.at("int8_rows").rows_max, -1);
  EXPECT_EQ(p.schemes.at("w8a8_dynamic").requires_packages,
            (std::vector<std::string>{"flashrt/gemm"}));
  // The same layout at decode rows: no band of its own, so the structure's decode band.
  EXPECT_EQ(p.forms.at("int8_act").format, WeightFormat::int8_gemm);
  EXPECT_EQ(p.forms.at("int8_act").rows_min, 0);
  EXPECT_EQ(p.schemes.at("w8a8_decode").formats.at("lm_head"), "int8_act");
  EXPECT_EQ(p.schemes.at("w4a16_sym_decode").formats.at("lm_head"), "int8");
  EXPECT_EQ(p.schemes.at("w4a16_sym_decode").indivisible, "int8");
  // The default w4 scheme takes the offset grid with a Q8_0-class head (by measured accuracy).
  EXPECT_EQ(p.schemes.at("w4a16_decode").formats.at("decoder_ffn"), "int4_g32_asym");
  EXPECT_EQ(p.forms.at("int4_g32_asym").describe(), "int4 g32 asymmetric f16 scales");
  EXPECT_EQ(p.schemes.at("w4a16_decode").formats.at("lm_head"), "int8_g32");
  EXPECT_EQ(p.schemes.at("w4a16_decode").indivisible, "int8");
  EXPECT_TRUE(p.schemes.at("none").formats.empty());

  EXPECT_EQ(c.band(OutputKind::values).metric, "cosine");
  EXPECT_DOUBLE_EQ(c.band(OutputKind::values).pass, 0.999);
  EXPECT_EQ(c.band(OutputKind::distribution).metric, "top1_agreement");
  EXPECT_DOUBLE_EQ(c.band(OutputKind::distribution).warn, 0.85);
  EXPECT_EQ(c.decode_self_check().probe_tokens, 8);
  EXPECT_DOUBLE_EQ(c.decode_self_check().top1_agreement, 0.75);
  EXPECT_DOUBLE_EQ(c.decode_self_check().logits_cosine, 0.999);
  EXPECT_DOUBLE_EQ(c.decode_self_check().keys_cosine, 0.99);

  const BindingSpec& llama = c.binding("llama_decode");
  EXPECT_EQ(llama.layers, "model.layers");
  EXPECT_THROW(c.binding("gpt2_decode"), InvalidArgument);
  EXPECT_EQ(llama.decode_package, "flashrt/decode");
  EXPECT_EQ(llama.linear_package, "flashrt/linear");
  EXPECT_EQ(llama.ffn_package, "flashrt/ffn");
  EXPECT_TRUE(c.missing_packages({"flashrt/linear", "flashrt/ffn", "flashrt/gemm",
                                  "flashrt/recurrent", "flashrt/decode"})
                  .empty());
  // flashrt/ffn not visible: every rung on it is named, decoder_ffn's among them.
  const std::vector<std::string> missing =
      c.missing_packages({"flashrt/linear", "flashrt/gemm", "flashrt/recurrent", "flashrt/decode"});
  ASSERT_FALSE(missing.empty());
  bool decoder_ffn_named = false;
  for (const std::string& m : missing) {
    EXPECT_NE(m.find("'flashrt/ffn' is not on the kernel path"), std::string::npos) << m;
    decoder_ffn_named |=
        m.find("ladders.yaml: ladders.decoder_ffn[0].package") != std::string::npos;
  }
  EXPECT_TRUE(decoder_ffn_named) << missing[0];
}

TEST(Catalog, GetOfAnUnknownNameListsTheKnownOnes) {
  const Catalog c = Catalog::load(kCatalogDir);
  try {
    c.get("sliding_attention");
    FAIL() << "get() accepted an unknown name";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown structure 'sliding_attention'"), std::string::npos) << msg;
    for (const std::string& name : kShipped)
      EXPECT_NE(msg.find(name), std::string::npos) << name << " in: " << msg;
  }
}

TEST_F(CatalogFiles, ValidSpecLoadsAndOtherFilesAreIgnored) {
  write("structures/demo.yaml", kValid);
  write("structures/README.md", "not a spec");
  write("structures/demo.yaml.bak", "name: [broken");
  write("README.md", "not a catalog file");
  const Catalog c = Catalog::load(dir_.string());
  EXPECT_EQ(c.names(), std::vector<std::string>{"demo"});
  const StructureSpec& s = c.get("demo");
  EXPECT_EQ(s.dim("n")->multiple_of, 16);
  EXPECT_EQ(s.dim("k")->max, -1);
  EXPECT_TRUE(s.attributes.empty());
  EXPECT_TRUE(s.boundary_excludes.empty());
  EXPECT_EQ(s.slot("weight")->dtypes, std::vector<DType>{DType::f32});
  ASSERT_EQ(s.match.nodes.size(), 1u);
  EXPECT_EQ(s.match.nodes[0].name, "proj");
  EXPECT_EQ(s.match.nodes[0].out_dim, "n");
  EXPECT_EQ(s.match.nodes[0].in_dim, "k");
  // The policy files are optional: none declared, none in force.
  EXPECT_TRUE(c.ladders().empty());
  EXPECT_TRUE(c.schemes().schemes.empty());
  EXPECT_TRUE(c.bindings().empty());
  EXPECT_THROW(c.band(OutputKind::values), InvalidArgument);
}

TEST_F(CatalogFiles, ValidPolicyLoads) {
  write_valid_catalog();
  const Catalog c = Catalog::load(dir_.string());
  ASSERT_EQ(c.ladder("demo").size(), 1u);
  EXPECT_EQ(c.ladder("demo")[0].op, OpKind::linear);
  EXPECT_EQ(c.schemes().schemes.at("w8").formats.at("demo"), "int8");
  EXPECT_EQ(c.schemes().min_seat_weights, 0);
  EXPECT_DOUBLE_EQ(c.band(OutputKind::distribution).pass, 0.95);
}

TEST_F(CatalogFiles, DigestIgnoresCommentsLayoutAndKeyOrder) {
  const std::string base = digest_of(kValid);
  std::string edited = "# a comment that says why\n" + kValid + "\n\n# trailing\n";
  edited = replaced(edited, "k: {min: 1}", "k:   {min: 1}    # in features");
  edited = replaced(edited, "pass: 0.999, warn: 0.995", "warn: 0.9950, pass: 0.999");
  edited = replaced(edited, "reference: \"y = x @ weight.T\"", "reference: 'y = x @ weight.T'");
  EXPECT_EQ(digest_of(edited), base);
}

TEST_F(CatalogFiles, DigestMovesWithAnyValue) {
  const std::string base = digest_of(kValid);
  const std::vector<std::pair<std::string, std::string>> edits = {
      {"version: 1", "version: 2"},        {"max: 16", "max: 8"},
      {"dtypes: [f32]", "dtypes: [bf16]"}, {"required: true", "required: false"},
      {"pass: 0.999", "pass: 0.9991"},     {"min_speedup: 1.02", "min_speedup: 1.05"},
      {"a test seam", "a test seam."},     {"y = x @ weight.T", "y = x @ weight.T + 0"},
      {"priority: 0", "priority: 5"},      {"site: node", "site: parent"},
  };
  for (const auto& [from, to] : edits) {
    EXPECT_NE(digest_of(replaced(kValid, from, to)), base) << from << " -> " << to;
  }
}

TEST_F(CatalogFiles, MissingOrEmptyDirIsAnError) {
  EXPECT_THROW(Catalog::load((dir_ / "nope").string()), InvalidArgument);
  write("structures/notes.txt", "no specs here");
  const std::string msg = load_error();
  EXPECT_NE(msg.find("holds no .yaml specs"), std::string::npos) << msg;
  // A spec outside structures/ is not a structure.
  write("demo.yaml", kValid);
  const std::string again = load_error();
  EXPECT_NE(again.find("holds no .yaml specs"), std::string::npos) << again;
}

TEST_F(CatalogFiles, YamlSyntaxError) {
  expect_error(replaced(kValid, "dtypes: [f32, bf16]}", "dtypes: [f32, bf16}"), "YAML syntax error",
               "line 11");
}

TEST_F(CatalogFiles, MissingRequiredField) {
  expect_error(replaced(kValid, "reference: \"y = x @ weight.T\"\n", ""), "reference",
               "missing required field");
  expect_error(replaced(kValid, "  latency: {min_speedup: 1.02}\n", ""), "gates.latency",
               "missing required field");
}

TEST_F(CatalogFiles, IllTypedField) {
  expect_error(replaced(kValid, "version: 1", "version: one"), "version",
               "expected an integer, got 'one'");
  expect_error(replaced(kValid, "required: true", "required: maybe"), "slots.weight.required",
               "expected true or false");
  expect_error(replaced(kValid, "shape: [n, k]", "shape: n"), "slots.weight.shape",
               "expected a list");
  expect_error(replaced(kValid, "pass: 0.999", "pass: high"), "gates.parity.pass",
               "expected a finite number");
}

TEST_F(CatalogFiles, UnknownFieldIsAnError) {
  expect_error(replaced(kValid, "required: true", "requried: true"), "slots.weight.requried",
               "unknown field");
}

TEST_F(CatalogFiles, NameMustMatchTheFileStem) {
  expect_error(replaced(kValid, "name: demo", "name: other"), "name",
               "'other' does not match the file name (expected 'demo')");
}

TEST_F(CatalogFiles, VersionBelowOne) {
  expect_error(replaced(kValid, "version: 1", "version: 0"), "version", "must be an integer >= 1");
}

TEST_F(CatalogFiles, ShapeNamesAnUndeclaredDim) {
  expect_error(replaced(kValid, "shape: [n, k]", "shape: [n, kk]"), "slots.weight.shape[1]",
               "'kk' is not a declared dim (dims: rows, k, n)");
  expect_error(replaced(kValid, "shape: [rows, n]", "shape: [rows, m]"),
               "boundary.outputs.y.shape[1]", "'m' is not a declared dim");
}

TEST_F(CatalogFiles, UnknownDtype) {
  expect_error(replaced(kValid, "dtypes: [f32]", "dtypes: [f32, fp16]"), "slots.weight.dtypes[1]",
               "unknown dtype 'fp16' (known: f32, bf16, i64)");
  expect_error(replaced(kValid, "dtypes: [f32, bf16]", "dtypes: [f32, float16]"),
               "boundary.inputs.x.dtypes[1]", "unknown dtype 'float16'");
  expect_error(replaced(kValid, "dtype_of: x", "dtype_of: w"), "boundary.outputs.y.dtype_of",
               "'w' is not a boundary input");
}

TEST_F(CatalogFiles, GateThresholds) {
  expect_error(replaced(kValid, "pass: 0.999, warn: 0.995", "pass: 0.99, warn: 0.995"),
               "gates.parity.pass", "is below warn");
  expect_error(replaced(kValid, "pass: 0.999", "pass: 1.5"), "gates.parity.pass",
               "must be in (0, 1]");
  expect_error(replaced(kValid, "warn: 0.995", "warn: 0"), "gates.parity.warn",
               "must be in (0, 1]");
  expect_error(replaced(kValid, "output: values", "output: logits"), "gates.parity.output",
               "unknown output kind 'logits'");
}

TEST_F(CatalogFiles, DuplicateNames) {
  expect_error(replaced(kValid, "  n: {min: 1, multiple_of: 16}\n",
                        "  n: {min: 1, multiple_of: 16}\n  k: {min: 2}\n"),
               "dims", "duplicate name 'k'");
  expect_error(replaced(kValid, "  weight: {", "  x: {shape: [k], dtypes: [f32]}\n  weight: {"),
               "slots.x", "duplicate name 'x' (also in boundary.inputs)");
  expect_error(replaced(kValid, "dtypes: [f32, bf16]", "dtypes: [f32, f32]"),
               "boundary.inputs.x.dtypes[1]", "duplicate entry 'f32'");
}

TEST_F(CatalogFiles, PointsMustResolve) {
  expect_error(replaced(kValid, "y: output", "z: output"), "points.z",
               "'z' is not a boundary output");
  expect_error(replaced(kValid, "y: output", "y: middle"), "points.y", "unknown side 'middle'");
}

TEST_F(CatalogFiles, DecodeBandNeedsAnUpperEnd) {
  expect_error(replaced(kValid, "min: 1, max: 16, decode_band: true", "min: 1, decode_band: true"),
               "dims.rows.max", "a decode band needs a max");
}

TEST_F(CatalogFiles, BandWithMinAboveMax) {
  expect_error(replaced(kValid, "rows: {min: 1, max: 16, decode_band: true}",
                        "rows: {min: 8, max: 4, decode_band: true}"),
               "dims.rows.max", "is below min (4 < 8)");
}

// ---- match patterns -------------------------------------------------------------------------

TEST_F(CatalogFiles, MatchSectionIsRequired) {
  const std::string text = replaced(kValid,
                                    "match:\n  priority: 0\n  site: node\n  nodes:\n    proj: "
                                    "{kind: linear, weight: weight}\n",
                                    "");
  expect_error(text, "match", "missing required field");
}

TEST_F(CatalogFiles, MatchNodeNamesAnUndeclaredSlot) {
  expect_error(replaced(kValid, "proj: {kind: linear, weight: weight}",
                        "proj: {kind: linear, weight: weights}"),
               "match.nodes.proj.weight", "'weights' is not a slot");
  expect_error(replaced(kValid, "proj: {kind: linear, weight: weight}",
                        "proj: {kind: linear, weight: weight, bias: b}"),
               "match.nodes.proj.bias", "'b' is not a slot");
}

TEST_F(CatalogFiles, ActivationNodeValues) {
  write("structures/demo.yaml", kWithActivation);
  const Catalog c = Catalog::load(dir_.string());
  EXPECT_EQ(c.get("demo").match.node("act")->kind, NodeKind::activation);
  EXPECT_EQ(c.get("demo").match.site, SiteKind::parent);
  expect_error(replaced(kWithActivation, "activation: [silu, gelu]", "activation: [silu, swish]"),
               "attributes.activation[1]", "unknown activation 'swish'");
  expect_error(replaced(kWithActivation, "attribute: activation}", "attribute: act_kind}"),
               "match.nodes.act.attribute", "'act_kind' is not a declared attribute");
  expect_error(replaced(kWithActivation, "feeds: [proj, act]", "feeds: [proj, norm]"),
               "match.flow[0].feeds", "'norm' is not a node");
}

TEST_F(CatalogFiles, NormNodesOptionalNodesAndModulatesAreCheckedAtLoad) {
  // A norm node, an optional second projection, modulates from the norm.
  const std::string with_norm =
      replaced(replaced(replaced(kWithActivation, "activation: [silu, gelu]", "norm: [layer]"),
                        "    act: {kind: activation, attribute: activation}",
                        "    twin: {kind: linear, weight: weight, optional: true}\n"
                        "    norm: {kind: norm, attribute: norm}"),
               "- feeds: [proj, act]", "- modulates: [norm, proj]");
  write("structures/demo.yaml", with_norm);
  const Catalog c = Catalog::load(dir_.string());
  EXPECT_EQ(c.get("demo").match.node("norm")->kind, NodeKind::norm);
  EXPECT_TRUE(c.get("demo").match.node("twin")->optional);
  EXPECT_EQ(c.get("demo").match.flow[0].kind, FlowKind::modulates);
  expect_error(replaced(with_norm, "- modulates: [norm, proj]", "- modulates: [proj, norm]"),
               "match.flow[0].modulates", "'proj' is not a norm node");
  expect_error(replaced(with_norm, "attribute: norm}", "attribute: norm, weight: weight}"),
               "match.nodes.norm.weight", "a norm node has none");
  expect_error(replaced(with_norm, "proj: {kind: linear, weight: weight}",
                        "proj: {kind: linear, weight: weight, optional: true}"),
               "match.nodes.proj.optional", "the first node is not");
  expect_error(replaced(with_norm, "kind: norm,", "kind: layernorm,"), "match.nodes.norm.kind",
               "'layernorm' is not linear, activation, norm, experts, recurrence, conv, attention, "
               "rotary or block");
  expect_error(replaced(with_norm, "site: parent", "site: parent\n  siblings: maybe"),
               "match.siblings", "");
}

// The shipped decoder block, renamed: a block structure is one block node binding hidden, whose
// attribute takes block forms; a block node elsewhere, or a second node, is refused at load.
TEST_F(CatalogFiles, BlockNodesAreOneBlockStructuresWholeMatch) {
  std::ifstream in(std::string(FRT_TEST_CATALOG_DIR) + "/structures/decoder_block.yaml");
  const std::string shipped((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string block = replaced(shipped, "name: decoder_block", "name: demo");
  write("structures/demo.yaml", block);
  const Catalog c = Catalog::load(dir_.string());
  EXPECT_EQ(c.get("demo").kind, "block");
  EXPECT_EQ(c.get("demo").match.node("block")->kind, NodeKind::block);
  EXPECT_EQ(node_dims(NodeKind::block), (std::vector<std::string>{"hidden"}));
  expect_error(replaced(block, "form: [pre_norm_residual]", "form: [post_norm]"),
               "attributes.form[0]", "unknown block form 'post_norm'");
  expect_error(replaced(block, "kind: block\n", "kind: function\n"), "match.nodes.block",
               "a block node belongs to a block structure");
  expect_error(replaced(block, "block: {kind: block, attribute: form}",
                        "block: {kind: block, attribute: form}\n    other: {kind: block, "
                        "attribute: form}"),
               "match", "");
}

// The shipped bank structure, renamed: an experts node binds its banks' dims, and banks that do
// not chain, a weight slot of indices, a bank under a non-routing op are refused at load.
TEST_F(CatalogFiles, ExpertsNodesBindBanksAndAreCheckedAtLoad) {
  std::ifstream in(std::string(FRT_TEST_CATALOG_DIR) + "/structures/moe_experts.yaml");
  const std::string shipped((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string bank = replaced(shipped, "name: moe_experts", "name: demo");
  write("structures/demo.yaml", bank);
  const Catalog c = Catalog::load(dir_.string());
  const MatchNode& n = *c.get("demo").match.node("bank");
  EXPECT_EQ(n.kind, NodeKind::experts);
  EXPECT_EQ(n.bank_slots, (std::vector<std::string>{"gate", "up", "down"}));
  EXPECT_EQ(n.experts_dim, "experts");
  EXPECT_EQ(n.out_dim, "intermediate");
  EXPECT_EQ(n.in_dim, "hidden");
  expect_error(replaced(bank, "down: {shape: [experts, hidden, intermediate]",
                        "down: {shape: [experts, intermediate, hidden]"),
               "match.nodes.bank.down", "banks do not chain");
  expect_error(replaced(bank, "gate: {shape: [experts, intermediate, hidden]",
                        "gate: {shape: [intermediate, hidden]"),
               "match.nodes.bank.gate", "slot 'gate' is not [experts, out, in]");
  expect_error(replaced(bank, "down: {shape: [experts, hidden, intermediate], dtypes: [f32, bf16]",
                        "down: {shape: [experts, hidden, intermediate], dtypes: [f32, i64]"),
               "slots.down.dtypes", "a weight slot holds f32 or bf16");
  expect_error(replaced(bank, "up: up, down: down,", "up: up,"), "match.nodes.bank", "down");
  expect_error(replaced(bank, "gate: gate, up: up,", "gate: gate, up: up, weight: gate,"),
               "match.nodes.bank.weight", "an experts node has none");
  // A bank under the gated feed-forward's op: the op does not route rows.
  write("structures/demo.yaml", bank);
  write("schemes.yaml", kSchemes);
  write("gates.yaml", kGates);
  write("ladders.yaml", replaced(kLadders, "{impl: linear, package: flashrt/linear, op: linear}",
                                 "{impl: ffn, package: flashrt/ffn, op: gated_ffn}"));
  expect_error_in("ladders.yaml", "ladders.demo[0].op", "does not route rows to experts");
}

TEST_F(CatalogFiles, APackedRungRunsTheLinearOpOverLinearNodesOnly) {
  write("structures/demo.yaml", kWithActivation);
  write("schemes.yaml", kSchemes);
  write("ladders.yaml", replaced(kLadders, "op: linear}", "op: linear, packed: true}"));
  expect_error_in("ladders.yaml", "ladders.demo[0].op",
                  "a packed rung stacks linear nodes; structure 'demo' has nodes of other kinds");
  write("ladders.yaml",
        replaced(kLadders, "op: linear}", "op: linear, packed: true, per_node: true}"));
  expect_error_in("ladders.yaml", "ladders.demo[0].packed",
                  "a packed rung runs the linear op once over every node");
}

// ---- policy files ---------------------------------------------------------------------------

TEST_F(CatalogFiles, PolicyYamlSyntaxError) {
  expect_policy_error("ladders.yaml", replaced(kLadders, "op: linear}", "op: linear"),
                      "YAML syntax error", "at line");
  expect_policy_error("schemes.yaml", replaced(kSchemes, "auto: [w8, none]", "auto: [w8, none"),
                      "YAML syntax error", "at line");
}

TEST_F(CatalogFiles, LadderRungNamesAnUnknownOp) {
  expect_policy_error("ladders.yaml", replaced(kLadders, "op: linear", "op: conv"),
                      "ladders.demo[0].op", "unknown op 'conv'");
}

TEST_F(CatalogFiles, LadderForAnUnknownStructure) {
  expect_policy_error("ladders.yaml", replaced(kLadders, "  demo:", "  ghost:"), "ladders.ghost",
                      "'ghost' is not a structure of this catalog (known: demo)");
}

TEST_F(CatalogFiles, RegionOpReadsASlotTheStructureLacks) {
  expect_policy_error("ladders.yaml", replaced(kLadders, "op: linear", "op: gated_ffn"),
                      "ladders.demo[0].op",
                      "op 'gated_ffn' reads slot 'gate', which structure 'demo' does not declare");
  // A region's rung on a function op (a norm's): the op does not replace what 'demo' describes.
  expect_policy_error("ladders.yaml", replaced(kLadders, "op: linear", "op: rmsnorm"),
                      "ladders.demo[0].op", "op 'rmsnorm' does not replace the function 'demo'");
  expect_policy_error("ladders.yaml", replaced(kLadders, "op: linear", "op: rotary"),
                      "ladders.demo[0].op", "op 'rotary' does not replace the function 'demo'");
  expect_policy_error("ladders.yaml", replaced(kLadders, "op: linear", "op: dense"),
                      "ladders.demo[0].op", "'dense' is not an op a seat runs");
  // The shipped catalog with linear_proj's rung turned into the gated ffn op.
  fs::remove_all(dir_);
  fs::copy(kCatalogDir, dir_, fs::copy_options::recursive);
  std::ifstream in(dir_ / "ladders.yaml");
  const std::string ladders((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write("ladders.yaml",
        replaced(ladders, "linear_proj:\n    - {impl: linear, package: flashrt/linear, op: linear}",
                 "linear_proj:\n    - {impl: linear, package: flashrt/linear, op: gated_ffn}"));
  expect_error_in("ladders.yaml", "ladders.linear_proj[0].op",
                  "op 'gated_ffn' reads slot 'gate', which structure 'linear_proj' does not "
                  "declare");
}

TEST_F(CatalogFiles, ALinearRungOnARegionOfSeveralProjectionsMustBePerNode) {
  // Without per_node, one linear seat would stand for the whole region (three weights, one site).
  fs::remove_all(dir_);
  fs::copy(kCatalogDir, dir_, fs::copy_options::recursive);
  std::ifstream in(dir_ / "ladders.yaml");
  const std::string ladders((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write("ladders.yaml", replaced(ladders, "{impl: ffn, package: flashrt/ffn, op: gated_ffn}",
                                 "{impl: ffn_lin, package: flashrt/linear, op: linear}"));
  expect_error_in("ladders.yaml", "ladders.decoder_ffn[0].op",
                  "the linear op seats one projection; structure 'decoder_ffn' is a region of 4 "
                  "nodes (set per_node: true)");
}

TEST_F(CatalogFiles, AnAttentionNodesCacheIsOneTheCoreKnowsAndItsOpReadsIt) {
  fs::remove_all(dir_);
  fs::copy(kCatalogDir, dir_, fs::copy_options::recursive);
  std::ifstream in(dir_ / "structures/attention_sequence.yaml");
  const std::string spec((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write("structures/attention_sequence.yaml",
        replaced(spec, "attribute: form, cache: none}", "attribute: form, cache: ring}"));
  expect_error_in("structures/attention_sequence.yaml", "match.nodes.attention.cache",
                  "'ring' is not one of dense, paged, none");
  // The decode rows' op over whole sequences: the op reads the host's cache, not the call's.
  write("structures/attention_sequence.yaml",
        replaced(spec, "attribute: form, cache: none}", "attribute: form}"));
  expect_error_in("ladders.yaml", "ladders.attention_sequence[0].op",
                  "op 'sequence_attention' does not replace the function 'attention_sequence' "
                  "describes");
}

TEST_F(CatalogFiles, ARungsBuildsAreAListOfNames) {
  fs::remove_all(dir_);
  fs::copy(kCatalogDir, dir_, fs::copy_options::recursive);
  std::ifstream in(dir_ / "ladders.yaml");
  const std::string ladders((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(Catalog::load(dir_.string()).ladder("attention_sequence").at(0).builds,
            std::vector<std::string>{"amx"});
  write("ladders.yaml", replaced(ladders, "builds: [amx]", "builds: []"));
  expect_error_in("ladders.yaml", "ladders.attention_sequence[0].builds", "");
}

TEST_F(CatalogFiles, AMatchPatternNeedsALinearNode) {
  // An activation alone: nothing to pack, and no weight to take dtype or rows from.
  expect_error(replaced(replaced(kWithActivation, "    proj: {kind: linear, weight: weight}\n", ""),
                        "    - feeds: [proj, act]\n", ""),
               "match.nodes", "needs at least one linear or experts node");
}

TEST_F(CatalogFiles, ALinearRungOnARegionOfOneProjectionAndAnActivationMustBePerNode) {
  // One projection and its activation under a parent: a linear seat at the parent would drop
  // the activation.
  write("structures/demo.yaml", kWithActivation);
  write("schemes.yaml", kSchemes);
  write("ladders.yaml", kLadders);
  expect_error_in("ladders.yaml", "ladders.demo[0].op",
                  "the linear op seats one projection; structure 'demo' is a region of 2 nodes");
}

TEST_F(CatalogFiles, ABindingIsHeldToWhatTheDecodeProgramComputes) {
  fs::remove_all(dir_);
  fs::copy(kCatalogDir, dir_, fs::copy_options::recursive);
  std::ifstream in(dir_ / "bindings/llama_decode.yaml");
  const std::string binding((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const HostGraph empty;
  const auto plan_error = [&](const std::string& text) {
    write("bindings/llama_decode.yaml", text);
    const Catalog c = Catalog::load(dir_.string());
    try {
      plan_decode(empty, c, "llama_decode", 32);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(plan_error(replaced(binding, "activation: [silu, gelu_tanh]",
                                "activation: [silu, gelu_tanh, gelu]"))
                .find("activation 'gelu' is not a form the decode program computes"),
            std::string::npos);
  EXPECT_NE(plan_error(replaced(binding, "  norm_form: [rms, rms_one_plus]\n", ""))
                .find("declares no norm_form it covers"),
            std::string::npos);
  EXPECT_NE(plan_error(replaced(binding, "  mlp: mlp\n", "  mlp: {path: mlp, required: false}\n"))
                .find("slot 'mlp' is read by every program, so it cannot be optional"),
            std::string::npos);
  EXPECT_NE(plan_error(replaced(binding, "  attn_in_norm: input_layernorm",
                                "  attn_norm: input_layernorm"))
                .find("names layer slot 'attn_norm', which the decode program does not read"),
            std::string::npos);
  EXPECT_NE(plan_error(replaced(binding, "  ffn_in_norm: post_attention_layernorm\n", ""))
                .find("names no norm around the feed-forward"),
            std::string::npos);
  EXPECT_NE(plan_error(replaced(binding, "  v: self_attn.v_proj\n", ""))
                .find("names neither q, k and v nor a fused qkv"),
            std::string::npos);
  EXPECT_NE(plan_error(replaced(binding, "  o: self_attn.o_proj\n", ""))
                .find("has no slot 'o', which the decode program reads"),
            std::string::npos);
  // The covered values are parsed into the core's enums at load.
  const Catalog shipped = Catalog::load(kCatalogDir);
  const BindingSpec& llama = shipped.binding("llama_decode");
  EXPECT_EQ(llama.norm_forms, (std::vector<NormForm>{NormForm::rms, NormForm::rms_one_plus}));
  EXPECT_EQ(llama.rope_kinds, (std::vector<RopeKind>{RopeKind::plain, RopeKind::linear,
                                                     RopeKind::llama3, RopeKind::yarn}));
  write("bindings/llama_decode.yaml",
        replaced(binding, "rope_type: [default, linear, llama3, yarn]",
                 "rope_type: [default, sliding]"));
  expect_error_in("bindings/llama_decode.yaml", "attributes.rope_type[1]",
                  "unknown rotary form 'sliding'");
  write("bindings/llama_decode.yaml",
        replaced(binding, "norm_form: [rms, rms_one_plus]", "norm_form: [rmsx]"));
  expect_error_in("bindings/llama_decode.yaml", "attributes.norm_form[0]",
                  "unknown norm form 'rmsx'");
  write("bindings/llama_decode.yaml",
        replaced(binding, "norm_form: [rms, rms_one_plus]", "colour: [red]"));
  expect_error_in("bindings/llama_decode.yaml", "attributes", "colour");
}

TEST_F(CatalogFiles, SchemeNamesAnUnknownForm) {
  expect_policy_error("schemes.yaml",
                      replaced(kSchemes, "formats: {demo: int8}", "formats: {demo: int3}"),
                      "schemes.w8.formats.demo", "'int3' is not a declared form");
}

TEST_F(CatalogFiles, AFormBandNeedsAMinOfOneOrMoreAndAMaxAboveIt) {
  const std::string form = "int8: {format: int8_channel, tag: w8a16}";
  expect_policy_error(
      "schemes.yaml",
      replaced(kSchemes, form, "int8: {format: int8_gemm, tag: w8a8, rows: {min: 0}}"),
      "forms.int8.rows.min", "must be >= 1");
  expect_policy_error(
      "schemes.yaml",
      replaced(kSchemes, form, "int8: {format: int8_gemm, tag: w8a8, rows: {min: 64, max: 8}}"),
      "forms.int8.rows.max", "below min");
  expect_policy_error(
      "schemes.yaml",
      replaced(kSchemes, form, "int8: {format: int8_gemm, tag: w8a8, rows: {least: 64}}"),
      "forms.int8.rows", "least");
}

TEST_F(CatalogFiles, ActivationBlocksBelongToTheGemmLayoutAndAre32) {
  const std::string form = "int8: {format: int8_channel, tag: w8a16}";
  expect_policy_error(
      "schemes.yaml",
      replaced(kSchemes, form, "int8: {format: int8_channel, act_block: 32, tag: w8a16}"),
      "forms.int8.act_block", "belongs to int8_gemm forms");
  expect_policy_error(
      "schemes.yaml",
      replaced(kSchemes, form, "int8: {format: int8_gemm, act_block: 64, tag: w8a8}"),
      "forms.int8.act_block", "not in {32}");
}

TEST_F(CatalogFiles, Int4GemmGroupsAre32WithHalfScales) {
  const std::string form = "int8: {format: int8_channel, tag: w8a16}";
  expect_policy_error(
      "schemes.yaml",
      replaced(kSchemes, form, "int8: {format: int4_gemm, group: 64, symmetric: true, tag: w4a8}"),
      "forms.int8.group", "not in {32}");
  // The int5 layouts hold a checkpoint's own values only: no scheme may name them.
  expect_policy_error("schemes.yaml",
                      replaced(kSchemes, form, "int8: {format: int5_gemm, group: 32, tag: q5}"),
                      "forms.int8.format", "no scheme packs a host weight in it");
  expect_policy_error(
      "schemes.yaml",
      replaced(kSchemes, form, "int8: {format: int4_gemm, group: 32, scales: f32, tag: w4a8}"),
      "forms.int8.scales", "'f32' not in {f16}");
  expect_policy_error(
      "schemes.yaml",
      replaced(kSchemes, form, "int8: {format: int8_gemm, symmetric: true, tag: w8a8}"),
      "forms.int8.symmetric", "belongs to int4 forms");
}

// A calibrated form is an int4 one, and a scheme naming it says what it is rounded against
// (Note [Calibrated rounding]); a calibration with no calibrated form is a comment.
TEST_F(CatalogFiles, CalibratedFormsAreInt4AndTheirSchemesDeclareTheirCalibration) {
  const std::string form = "int8: {format: int8_channel, tag: w8a16}";
  const std::string int4 = "int8: {format: int4_group, group: 32, tag: w4, calibrated: true}";
  expect_policy_error(
      "schemes.yaml",
      replaced(kSchemes, form, "int8: {format: int8_channel, tag: w8a16, calibrated: true}"),
      "forms.int8.calibrated", "belongs to int4_group and int4_gemm forms");
  expect_policy_error("schemes.yaml", replaced(kSchemes, form, int4), "schemes.w8",
                      "declares no calibration");
  expect_policy_error(
      "schemes.yaml",
      replaced(kSchemes, form, "int8: {format: int4_group, group: 64, tag: w4, calibrated: true}"),
      "forms.int8.calibrated", "calibrated forms take groups of 32");
  const std::string with = replaced(replaced(kSchemes, form, int4), "formats: {demo: int8}",
                                    "formats: {demo: int8}\n    calibration: {statistics: "
                                    "[input_moments], rows: 64, span: 512}");
  expect_policy_error("schemes.yaml", replaced(with, "[input_moments]", "[percentile]"),
                      "schemes.w8.calibration.statistics", "'percentile' not in {input_moments}");
  expect_policy_error("schemes.yaml", replaced(with, "rows: 64", "rows: 0"),
                      "schemes.w8.calibration.rows", "must be >= 1");
  expect_policy_error("schemes.yaml", replaced(with, "span: 512", "span: 500"),
                      "schemes.w8.calibration.span", "a positive multiple of 32");
  expect_policy_error("schemes.yaml",
                      replaced(kSchemes, "formats: {demo: int8}",
                               "formats: {demo: int8}\n    calibration: {statistics: "
                               "[input_moments], rows: 64, span: 512}"),
                      "schemes.w8.calibration", "names no calibrated form");
}

TEST_F(CatalogFiles, SchemeGivesAFormToAStructureWithoutALadder) {
  write_valid_catalog();
  fs::remove(dir_ / "ladders.yaml");
  expect_error_in("schemes.yaml", "schemes.w8.formats.demo",
                  "structure 'demo' has no ladder in ladders.yaml");
}

TEST_F(CatalogFiles, AutoListsAnUnknownScheme) {
  expect_policy_error("schemes.yaml", replaced(kSchemes, "auto: [w8, none]", "auto: [w9, none]"),
                      "auto[0]", "'w9' is not a scheme");
}

TEST_F(CatalogFiles, GatedAutoListsAnUnknownOrARepeatedScheme) {
  expect_policy_error(
      "schemes.yaml",
      replaced(kSchemes, "auto: [w8, none]", "auto: [w8, none]\ngated_auto: [w8, w9]"),
      "gated_auto[1]", "'w9' is not a scheme");
  expect_policy_error(
      "schemes.yaml",
      replaced(kSchemes, "auto: [w8, none]", "auto: [w8, none]\ngated_auto: [w8, none, w8]"),
      "gated_auto[2]", "duplicate entry 'w8'");
}

TEST_F(CatalogFiles, GateBandsOutOfOrder) {
  expect_policy_error("gates.yaml",
                      replaced(kGates, "pass: 0.95, warn: 0.85", "pass: 0.85, warn: 0.95"),
                      "output_kinds.distribution", "needs 0 < warn <= pass <= 1");
  expect_policy_error("gates.yaml", replaced(kGates, "values:", "logits:"), "output_kinds.logits",
                      "unknown output kind 'logits'");
}

TEST_F(CatalogFiles, DecodeSelfCheckIsOptionalButValidated) {
  write_valid_catalog();
  EXPECT_THROW(Catalog::load(dir_.string()).decode_self_check(), InvalidArgument);
  const std::string check =
      "self_checks:\n  decode_loop: {probe_tokens: 8, top1_agreement: 0.75, logits_cosine: "
      "0.999, keys_cosine: 0.999}\n";
  write("gates.yaml", kGates + check);
  EXPECT_EQ(Catalog::load(dir_.string()).decode_self_check().probe_tokens, 8);
  expect_policy_error("gates.yaml", kGates + replaced(check, "probe_tokens: 8", "probe_tokens: 0"),
                      "self_checks.decode_loop.probe_tokens", "must be >= 1");
  expect_policy_error("gates.yaml",
                      kGates + replaced(check, "logits_cosine: 0.999", "logits_cosine: 1.5"),
                      "self_checks.decode_loop.logits_cosine", "must be in (0, 1]");
  expect_policy_error("gates.yaml", kGates + replaced(check, "top1_agreement", "top5"),
                      "self_checks.decode_loop", "top5");
  expect_policy_error("gates.yaml", kGates + replaced(check, "decode_loop", "prefill_loop"),
                      "self_checks", "prefill_loop");
}

// A structure the planner has never seen, declared only in catalog files, is discovered and
// seated by the generic planner: two projections in sequence, seated one by one.
const std::string kProjPair = R"yaml(name: proj_pair
version: 1
kind: region
description: Two projections in sequence, y = b(a(x)), inside one module.
dims:
  rows: {min: 1, max: 16, decode_band: true}
  d_in: {min: 1}
  d_mid: {min: 1}
  d_out: {min: 1}
boundary:
  inputs:
    x: {shape: [rows, d_in], dtypes: [f32, bf16]}
  outputs:
    y: {shape: [rows, d_out], dtype_of: x}
slots:
  a: {shape: [d_mid, d_in], dtypes: [f32, bf16], required: true}
  b: {shape: [d_out, d_mid], dtypes: [f32, bf16], required: true}
points:
  x: input
  y: output
gates:
  parity: {output: values, pass: 0.999, warn: 0.995}
  latency: {min_speedup: 1.02}
match:
  priority: 20
  site: parent
  nodes:
    a: {kind: linear, weight: a}
    b: {kind: linear, weight: b}
  flow:
    - feeds: [a, b]
reference: "y = ((x.f32 @ a.f32.T) @ b.f32.T).to(x.dtype)"
)yaml";

HostModule host_module(const std::string& path, ModuleKind kind,
                       std::vector<std::string> children = {}) {
  HostModule m;
  m.path = path;
  m.kind = kind;
  m.type_name = "Opaque";
  m.children = std::move(children);
  return m;
}

HostModule host_linear(const std::string& path, int64_t in, int64_t out, int64_t id) {
  HostModule m = host_module(path, ModuleKind::linear);
  m.in_features = in;
  m.out_features = out;
  m.weight_dtype = DType::f32;
  m.weight_id = id;
  return m;
}

HostCall host_call(const std::string& path, int64_t in_id, int64_t out_id, int64_t width) {
  HostCall c;
  c.path = path;
  c.rows = 1;
  c.width = width;
  c.dtype = DType::f32;
  c.input_id = in_id;
  c.output_id = out_id;
  return c;
}

TEST_F(CatalogFiles, ANewStructureInTheCatalogIsPlannedWithoutPlannerChanges) {
  fs::remove_all(dir_);
  fs::copy(kCatalogDir, dir_, fs::copy_options::recursive);
  const auto read = [&](const std::string& file) {
    std::ifstream in(dir_ / file);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  write("structures/proj_pair.yaml", kProjPair);
  std::string ladders = read("ladders.yaml");
  if (!ladders.empty() && ladders.back() != '\n') ladders += '\n';
  write("ladders.yaml",
        ladders +
            "  proj_pair:\n    - {impl: pair_as_projections, package: flashrt/linear, "
            "op: linear, per_node: true}\n");
  // Only the w8 scheme's formats begin with linear_proj at int8.
  write("schemes.yaml", replaced(read("schemes.yaml"), "formats: {linear_proj: int8,",
                                 "formats: {proj_pair: int8, linear_proj: int8,"));
  const Catalog catalog = Catalog::load(dir_.string());
  ASSERT_TRUE(contains(catalog.names(), "proj_pair"));
  ASSERT_EQ(catalog.ladder("proj_pair").size(), 1u);

  // pair.a [512x256] feeds pair.b [128x512]; lone.c reads something else.
  HostGraph g;
  g.modules = {host_module("", ModuleKind::module, {"pair", "lone"}),
               host_module("pair", ModuleKind::module, {"pair.a", "pair.b"}),
               host_linear("pair.a", 256, 512, 1),
               host_linear("pair.b", 512, 128, 2),
               host_module("lone", ModuleKind::module, {"lone.c"}),
               host_linear("lone.c", 256, 512, 3)};
  g.calls = {host_call("pair.a", 10, 11, 256), host_call("pair.b", 11, 12, 512),
             host_call("lone.c", 20, 21, 256)};

  KernelPathConfig config;
  config.bundled_root = FRT_TEST_KERNEL_ROOT;
  KernelHub hub(config);
  PlanOptions o;
  o.structures = {"proj_pair", "linear_proj"};
  o.scheme = "w8a16_channel_decode";
  const Plan p = plan(g, catalog, o, hub);
  // proj_pair claims its two projections first (priority 20 over linear_proj's 0).
  EXPECT_EQ(p.seams_found, 2) << explain(p);
  EXPECT_TRUE(p.refused.empty()) << explain(p);
  EXPECT_TRUE(p.keep_host.empty()) << explain(p);
  ASSERT_EQ(p.seats.size(), 3u) << explain(p);
  std::map<std::string, const SeatPlan*> by_site;
  for (const SeatPlan& s : p.seats) by_site[s.site] = &s;
  for (const std::string site : {"pair.a", "pair.b"}) {
    ASSERT_EQ(by_site.count(site), 1u) << site << "\n" << explain(p);
    const SeatPlan& s = *by_site.at(site);
    EXPECT_EQ(s.seam.structure, "proj_pair");
    EXPECT_EQ(s.seam.site, "pair");
    EXPECT_EQ(s.seam.nodes.at("a"), "pair.a");
    EXPECT_EQ(s.seam.nodes.at("b"), "pair.b");
    EXPECT_EQ(s.seam.dims.at("d_mid"), 512);
    EXPECT_EQ(s.seam.weight_count, 256 * 512 + 512 * 128);
    EXPECT_EQ(s.impl, "pair_as_projections_w8a16");
    EXPECT_EQ(s.package, "flashrt/linear");
    EXPECT_EQ(s.op, OpKind::linear);
    EXPECT_EQ(s.form.format, WeightFormat::int8_channel);
    EXPECT_EQ(s.replaces, std::vector<std::string>{site});
    EXPECT_EQ(s.slots.at("weight").module, site);
    EXPECT_EQ(s.slots.at("weight").tensor, "weight");
    EXPECT_EQ(s.act_dtype, DType::f32);
    EXPECT_TRUE(s.ladder.empty());
  }
  ASSERT_EQ(by_site.count("lone.c"), 1u) << explain(p);
  EXPECT_EQ(by_site.at("lone.c")->seam.structure, "linear_proj");

  // A scheme that gives proj_pair no form keeps it at host precision, with that reason.
  o.structures = {"proj_pair"};
  o.scheme = "w4a16_decode";
  const Plan w4 = plan(g, catalog, o, hub);
  EXPECT_TRUE(w4.seats.empty()) << explain(w4);
  ASSERT_EQ(w4.keep_host.size(), 1u) << explain(w4);
  EXPECT_EQ(w4.keep_host[0].first, "pair");
  EXPECT_NE(w4.keep_host[0].second.find("scheme 'w4a16_decode' keeps proj_pair"), std::string::npos)
      << w4.keep_host[0].second;
}

}  // namespace
}  // namespace frt

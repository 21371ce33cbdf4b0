#include "flashrt/catalog.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "flashrt/errors.h"

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
reference: "y = x @ weight.T"
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

  void write(const std::string& file, const std::string& text) {
    std::ofstream(dir_ / file, std::ios::binary) << text;
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

  // Loads `text` as demo.yaml and expects the error to name the file, the field and the problem.
  void expect_error(const std::string& text, const std::string& field, const std::string& what) {
    write("demo.yaml", text);
    const std::string msg = load_error();
    EXPECT_NE(msg.find((dir_ / "demo.yaml").string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(field), std::string::npos) << "field '" << field << "' in: " << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << "'" << what << "' in: " << msg;
  }

  std::string digest_of(const std::string& text) {
    write("demo.yaml", text);
    return Catalog::load(dir_.string()).get("demo").digest;
  }

  fs::path dir_;
};

TEST(Catalog, ShippedCatalogHoldsTheThreeStructures) {
  const Catalog c = Catalog::load(kCatalogDir);
  EXPECT_EQ(c.dir(), kCatalogDir);
  EXPECT_EQ(c.names(), (std::vector<std::string>{"decoder_ffn", "linear_proj", "lm_head"}));
  std::set<std::string> digests;
  for (const std::string& name : c.names()) {
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
    EXPECT_EQ(s.outputs[0].dtypes, (std::vector<std::string>{"f32", "bf16"}));
  }
  EXPECT_EQ(digests.size(), 3u);
}

TEST(Catalog, ShippedSpecsSayWhatTheBriefSays) {
  const Catalog c = Catalog::load(kCatalogDir);

  const StructureSpec& lin = c.get("linear_proj");
  ASSERT_NE(lin.slot("weight"), nullptr);
  EXPECT_EQ(lin.slot("weight")->shape, (std::vector<std::string>{"out_features", "in_features"}));
  ASSERT_NE(lin.slot("bias"), nullptr);
  EXPECT_FALSE(lin.slot("bias")->required);
  EXPECT_EQ(lin.slot("missing"), nullptr);
  EXPECT_EQ(lin.gate.kind, "values");
  EXPECT_DOUBLE_EQ(lin.gate.pass, 0.999);
  EXPECT_DOUBLE_EQ(lin.gate.warn, 0.995);
  EXPECT_FALSE(lin.tied_allowed);

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

  const StructureSpec& head = c.get("lm_head");
  EXPECT_TRUE(head.tied_allowed);
  EXPECT_EQ(head.slot("weight")->shape, (std::vector<std::string>{"vocab", "hidden"}));
  EXPECT_EQ(head.gate.kind, "distribution");
  EXPECT_DOUBLE_EQ(head.gate.pass, 0.95);
  EXPECT_DOUBLE_EQ(head.gate.warn, 0.85);
}

TEST(Catalog, GetOfAnUnknownNameListsTheKnownOnes) {
  const Catalog c = Catalog::load(kCatalogDir);
  try {
    c.get("attention_core");
    FAIL() << "get() accepted an unknown name";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown structure 'attention_core'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("decoder_ffn, linear_proj, lm_head"), std::string::npos) << msg;
  }
}

TEST_F(CatalogFiles, ValidSpecLoadsAndOtherFilesAreIgnored) {
  write("demo.yaml", kValid);
  write("README.md", "not a spec");
  write("demo.yaml.bak", "name: [broken");
  const Catalog c = Catalog::load(dir_.string());
  EXPECT_EQ(c.names(), std::vector<std::string>{"demo"});
  const StructureSpec& s = c.get("demo");
  EXPECT_EQ(s.dim("n")->multiple_of, 16);
  EXPECT_EQ(s.dim("k")->max, -1);
  EXPECT_TRUE(s.attributes.empty());
  EXPECT_TRUE(s.boundary_excludes.empty());
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
  };
  for (const auto& [from, to] : edits) {
    EXPECT_NE(digest_of(replaced(kValid, from, to)), base) << from << " -> " << to;
  }
}

TEST_F(CatalogFiles, MissingOrEmptyDirIsAnError) {
  EXPECT_THROW(Catalog::load((dir_ / "nope").string()), InvalidArgument);
  write("notes.txt", "no specs here");
  const std::string msg = load_error();
  EXPECT_NE(msg.find("holds no .yaml specs"), std::string::npos) << msg;
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
               "unknown dtype 'fp16' (known: f32, bf16)");
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

}  // namespace
}  // namespace frt

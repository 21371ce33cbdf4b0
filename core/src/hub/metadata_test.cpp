#include "metadata.h"

#include <flashrt/utf8.h>
#include <gtest/gtest.h>

#include <string>

namespace frt::detail {
namespace {

const std::string kSha(64, 'a');

std::string variant_json(const std::string& name, const std::string& isa,
                         const std::string& extra = "") {
  return R"({"name": ")" + name + R"(", "arch": "x86_64", "os": "linux", "isa": ")" + isa +
         R"(", "requires": ["avx2", "fma", "f16c"], "library": "build/)" + name +
         R"(/libfrt_linear.so", "sha256": ")" + kSha + "\"" + extra + "}";
}

std::string package_json(const std::string& variants, const std::string& name = "flashrt/linear",
                         const std::string& abi_major = "1") {
  return R"({"name": ")" + name +
         R"(", "version": "1.0.0", "revision": "3f2a9c1b7d0e", "abi_major": )" + abi_major +
         R"(, "abi_minor": 0, "variants": )" + variants + "}";
}

std::string error_of(const std::string& text, const std::string& expected = "flashrt/linear") {
  try {
    parse_metadata(text, "/pkgs/flashrt/linear", expected);
  } catch (const MetadataError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(MetadataTest, ParsesAWellFormedPackage) {
  const PackageMetadata md =
      parse_metadata(package_json("[" + variant_json("cpu-x86_64-linux-avx2", "avx2") + "]"),
                     "/pkgs/flashrt/linear", "flashrt/linear");
  EXPECT_EQ(md.name, "flashrt/linear");
  EXPECT_EQ(md.version, "1.0.0");
  EXPECT_EQ(md.revision, "3f2a9c1b7d0e");
  EXPECT_EQ(md.abi_major, 1);
  EXPECT_EQ(md.abi_minor, 0);
  EXPECT_EQ(md.dir, "/pkgs/flashrt/linear");
  ASSERT_EQ(md.variants.size(), 1u);
  const VariantMetadata& v = md.variants[0];
  EXPECT_EQ(v.name, "cpu-x86_64-linux-avx2");
  EXPECT_EQ(v.arch, "x86_64");
  EXPECT_EQ(v.os, "linux");
  EXPECT_EQ(v.isa, "avx2");
  EXPECT_EQ(v.requires_features, (std::vector<std::string>{"avx2", "fma", "f16c"}));
  EXPECT_EQ(v.library_path, "/pkgs/flashrt/linear/build/cpu-x86_64-linux-avx2/libfrt_linear.so");
  EXPECT_EQ(v.sha256, kSha);
}

TEST(MetadataTest, ParsesVariantNames) {
  const VariantName n = parse_variant_name("cpu-x86_64-linux-avx512vnni");
  EXPECT_EQ(n.arch, "x86_64");
  EXPECT_EQ(n.os, "linux");
  EXPECT_EQ(n.isa, "avx512vnni");
  for (const char* bad : {"", "cpu", "gpu-x86_64-linux-avx2", "cpu-x86_64-linux",
                          "cpu-x86_64-linux-avx2-extra", "cpu--linux-avx2"}) {
    EXPECT_THROW(parse_variant_name(bad), MetadataError) << bad;
  }
}

TEST(MetadataTest, TruncatedJsonNamesTheFile) {
  const std::string text = package_json("[]");
  const std::string err = error_of(text.substr(0, text.size() / 2));
  EXPECT_NE(err.find("/pkgs/flashrt/linear/metadata.json: invalid JSON"), std::string::npos) << err;
}

TEST(MetadataTest, WrongTypesNameFieldAndValue) {
  EXPECT_NE(error_of(package_json("\"none\""))
                .find("field 'variants' must be an array, got string \"none\""),
            std::string::npos)
      << error_of(package_json("\"none\""));
  EXPECT_NE(error_of(package_json("[]", "flashrt/linear", "\"1\""))
                .find("field 'abi_major' must be a non-negative integer, got string \"1\""),
            std::string::npos);
  EXPECT_NE(error_of(package_json("[3]")).find("'variants[0]' must be an object, got number 3"),
            std::string::npos);
  const std::string bad_req = package_json(
      R"([{"name": "cpu-x86_64-linux-avx2", "arch": "x86_64", "os": "linux", "isa": "avx2",
           "requires": [7], "library": "x.so", "sha256": ")" +
      kSha + R"("}])");
  EXPECT_NE(error_of(bad_req).find("field 'variants[0].requires[0]' must be a non-empty string"),
            std::string::npos)
      << error_of(bad_req);
}

TEST(MetadataTest, MissingFieldIsNamed) {
  const std::string text = R"({"name": "flashrt/linear", "version": "1.0.0", "abi_major": 1,
                               "abi_minor": 0, "variants": []})";
  EXPECT_NE(error_of(text).find("missing field 'revision'"), std::string::npos) << error_of(text);
  const std::string no_sha = package_json(
      R"([{"name": "cpu-x86_64-linux-avx2", "arch": "x86_64", "os": "linux", "isa": "avx2",
           "requires": [], "library": "x.so"}])");
  EXPECT_NE(error_of(no_sha).find("missing field 'variants[0].sha256'"), std::string::npos)
      << error_of(no_sha);
}

TEST(MetadataTest, NameMustMatchFolder) {
  const std::string err = error_of(package_json("[]", "flashrt/ffn"));
  EXPECT_NE(err.find("field 'name' is 'flashrt/ffn' but the package sits where 'flashrt/linear' "
                     "belongs"),
            std::string::npos)
      << err;
  EXPECT_NE(error_of(package_json("[]", "linear"), "linear")
                .find("field 'name' must be '<org>/<package>', got 'linear'"),
            std::string::npos);
}

TEST(MetadataTest, VariantNameMustAgreeWithFields) {
  const std::string err =
      error_of(package_json("[" + variant_json("cpu-x86_64-linux-avx2", "generic") + "]"));
  EXPECT_NE(err.find("variant 'cpu-x86_64-linux-avx2' names isa 'avx2' but field "
                     "'variants[0].isa' is 'generic'"),
            std::string::npos)
      << err;
  const std::string bad_name = error_of(package_json("[" + variant_json("avx2", "avx2") + "]"));
  EXPECT_NE(bad_name.find("variant name 'avx2' is not of the form cpu-<arch>-<os>-<isa>"),
            std::string::npos)
      << bad_name;
}

TEST(MetadataTest, DigestMustBeLowerHex) {
  std::string v = variant_json("cpu-x86_64-linux-avx2", "avx2");
  v.replace(v.find(kSha), kSha.size(), std::string(64, 'A'));
  const std::string err = error_of(package_json("[" + v + "]"));
  EXPECT_NE(err.find("field 'variants[0].sha256' must be 64 lower-case hex digits"),
            std::string::npos)
      << err;
}

TEST(MetadataTest, DuplicateVariantRefused) {
  const std::string v = variant_json("cpu-x86_64-linux-avx2", "avx2");
  const std::string err = error_of(package_json("[" + v + "," + v + "]"));
  EXPECT_NE(err.find("variant 'cpu-x86_64-linux-avx2' is declared twice"), std::string::npos)
      << err;
}

TEST(MetadataTest, UnreadableFile) {
  try {
    read_metadata("/nonexistent/frt/flashrt/linear", "flashrt/linear");
    FAIL() << "no error";
  } catch (const MetadataError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "/nonexistent/frt/flashrt/linear/metadata.json: cannot be opened for reading"),
              std::string::npos)
        << e.what();
  }
}

// Issue 13: a refusal's text reaches Python as str, so bytes from the file that are not UTF-8
// are escaped, never passed on.
TEST(MetadataTest, BytesThatAreNotUtf8AreEscapedInTheMessage) {
  const std::string err = error_of(package_json("[]", "flashrt/\xff\xfeinear"));
  EXPECT_TRUE(is_valid_utf8(err)) << err;
  EXPECT_NE(err.find("/pkgs/flashrt/linear/metadata.json: invalid JSON"), std::string::npos) << err;
  EXPECT_NE(err.find("\\xff"), std::string::npos) << err;
  // The path is file content too (a folder name is bytes).
  try {
    parse_metadata("{", "/pkgs/\xff/linear", "flashrt/linear");
    FAIL() << "no error";
  } catch (const MetadataError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("/pkgs/\\xff/linear/metadata.json: invalid JSON", 0), 0u)
        << e.what();
  }
}

TEST(MetadataTest, QuotedValuesAreCutBetweenCharacters) {
  // 79 bytes of ASCII, then two-byte characters: a cut at byte 80 would split one.
  const std::string e_acute = "\xc3\xa9";
  std::string value = std::string(77, 'a');
  for (int i = 0; i < 40; ++i) value += e_acute;
  const std::string err = error_of(R"({"name": "flashrt/linear", "version": [")" + value + "\"]}");
  EXPECT_TRUE(is_valid_utf8(err)) << err;
  EXPECT_NE(
      err.find("field 'version' must be a string, got array [\"" + std::string(77, 'a') + "..."),
      std::string::npos)
      << err;
  // A huge value is cut, not quoted whole.
  const std::string huge = error_of(package_json("[]", std::string(1 << 20, 'x')));
  EXPECT_LT(huge.size(), 400u);
  EXPECT_NE(huge.find("field 'name' must be '<org>/<package>', got 'xxx"), std::string::npos);
}

TEST(MetadataTest, DeepNestingIsRefusedNotOverflowed) {
  // 10^5 levels overflowed the stack when the value was quoted (nlohmann's dump recurses).
  for (const char* open : {"[", "{\"a\":"}) {
    std::string deep;
    for (int i = 0; i < 100000; ++i) deep += open;
    const std::string err = error_of(R"({"name": "flashrt/linear", "version": )" + deep);
    EXPECT_NE(err.find("metadata.json: invalid JSON: arrays and objects nested deeper than 64 "
                       "levels"),
              std::string::npos)
        << err.substr(0, 200);
  }
  // At the limit it is still an ordinary type error.
  const std::string ok_depth = std::string(62, '[') + std::string(62, ']');
  EXPECT_NE(error_of(R"({"name": "flashrt/linear", "version": )" + ok_depth + "}")
                .find("field 'version' must be a string, got array"),
            std::string::npos);
}

TEST(MetadataTest, NumbersPastDoubleAreMetadataErrors) {
  // nlohmann reports "1e999" as out_of_range, not parse_error; it used to escape the parser.
  for (const char* n : {"1e999", "-1e999",
                        "1"
                        "0000000000000000000000000000000000000000"}) {
    const std::string err = error_of(package_json("[]", "flashrt/linear", n));
    EXPECT_NE(err.find("metadata.json: "), std::string::npos) << n << ": " << err;
  }
  EXPECT_NE(error_of(package_json("[]", "flashrt/linear", "1e999")).find("invalid JSON"),
            std::string::npos);
}

TEST(MetadataTest, DuplicateKeysRefused) {
  EXPECT_NE(error_of(R"({"name": "flashrt/linear", "name": "flashrt/linear"})")
                .find("invalid JSON: key 'name' appears twice in one object"),
            std::string::npos);
  std::string v = variant_json("cpu-x86_64-linux-avx2", "avx2");
  v.insert(v.size() - 1, R"(, "sha256": ")" + std::string(64, 'b') + "\"");
  const std::string err = error_of(package_json("[" + v + "]"));
  EXPECT_NE(err.find("key 'sha256' appears twice in one object"), std::string::npos) << err;
  // The same key in sibling objects is not a duplicate.
  const std::string two = package_json("[" + variant_json("cpu-x86_64-linux-avx2", "avx2") + "," +
                                       variant_json("cpu-x86_64-linux-generic", "generic") + "]");
  EXPECT_EQ(parse_metadata(two, "/pkgs/flashrt/linear", "flashrt/linear").variants.size(), 2u);
}

}  // namespace
}  // namespace frt::detail

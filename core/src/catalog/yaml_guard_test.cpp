#include "yaml_guard.h"

#include <flashrt/errors.h>
#include <flashrt/utf8.h>
#include <gtest/gtest.h>

#include <string>

namespace frt::detail {
namespace {

std::string error_of(std::string_view text) {
  try {
    check_yaml_text("/cat/decoder_ffn.yaml", text);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(YamlGuardTest, AcceptsUtf8Text) {
  EXPECT_EQ(error_of("name: decoder_ffn\ndescription: caf\xc3\xa9 \xe2\x82\xac\n"), "(no error)");
  EXPECT_EQ(error_of("\xef\xbb\xbfname: x\n"), "(no error)");  // a UTF-8 byte order mark
  EXPECT_EQ(error_of(""), "(no error)");
}

TEST(YamlGuardTest, RefusesBytesThatAreNotUtf8WithLineAndColumn) {
  const std::string err = error_of("name: x\ndescription: caf\xc3\xa9 \xff\xfe tail\n");
  EXPECT_EQ(err,
            "/cat/decoder_ffn.yaml: line 2, column 19: bytes that are not UTF-8 (\\xff\\xfe t); "
            "a catalog file is UTF-8");
  EXPECT_TRUE(is_valid_utf8(err));
  for (const char* bad : {"\x80", "a: \xc3", "a: \xed\xa0\x80", "a: \xc0\xaf", "\xfe\xff"}) {
    EXPECT_NE(error_of(bad).find("bytes that are not UTF-8"), std::string::npos) << bad;
  }
}

TEST(YamlGuardTest, RefusesControlCharacters) {
  EXPECT_EQ(error_of(std::string("\x0e\0\0\0m: 1", 8)),
            "/cat/decoder_ffn.yaml: line 1, column 1: character U+000E is not allowed in YAML (a "
            "control character)");
  EXPECT_EQ(error_of("a: 1\nb: x\x7f"),
            "/cat/decoder_ffn.yaml: line 2, column 5: character U+007F is not allowed in YAML (a "
            "control character)");
  EXPECT_NE(error_of("a: \xc2\x9b").find("U+009B"), std::string::npos);      // a C1 control
  EXPECT_NE(error_of("a: \xef\xbf\xbe").find("U+FFFE"), std::string::npos);  // a noncharacter
  // Tab, CR LF, NEL, no-break space and characters past the BMP are text.
  EXPECT_EQ(error_of("a:\t1\r\nb: \xc2\x85\xc2\xa0\xf0\x9f\x98\x80\n"), "(no error)");
}

TEST(YamlGuardTest, RefusesDeepFlowNesting) {
  const std::string deep = "dims: " + std::string(10000, '[') + "1" + std::string(10000, ']');
  EXPECT_EQ(error_of("name: x\n" + deep),
            "/cat/decoder_ffn.yaml: line 2, column 71: flow collections nested deeper than 64 "
            "levels");
  EXPECT_NE(error_of("a: " + std::string(100, '{')).find("nested deeper than 64"),
            std::string::npos);
  // 64 levels pass, and brackets in quotes or comments do not count.
  EXPECT_EQ(error_of("a: " + std::string(64, '[') + std::string(64, ']')), "(no error)");
  const std::string many(100, '[');
  EXPECT_EQ(error_of("a: \"" + many + "\"\nb: '" + many + "'\n# " + many + "\nc: 1 #" + many),
            "(no error)");
  EXPECT_EQ(error_of("a: \"\\\"" + many + "\"\nb: 'it''s " + many + "'"), "(no error)");
  EXPECT_NE(error_of("a: 'x' " + std::string(65, '[')).find("nested deeper"), std::string::npos);
}

TEST(YamlGuardTest, FileNameIsEscapedToo) {
  try {
    check_yaml_text("/cat/\xff.yaml", "\xff");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("/cat/\\xff.yaml: line 1, column 1:", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace frt::detail

#include <flashrt/utf8.h>
#include <gtest/gtest.h>

#include <string>

namespace frt {
namespace {

TEST(Utf8Test, ValidTextIsKeptAsIs) {
  // ASCII with a backslash, 2-, 3- and 4-byte characters, and the extremes of each range.
  for (const std::string& s :
       {std::string(""), std::string("plain \\x41 text"), std::string("caf\xc3\xa9"),
        std::string("\xe2\x82\xac 5"), std::string("\xf0\x9f\x98\x80"), std::string("\xc2\x80"),
        std::string("\xdf\xbf"), std::string("\xe0\xa0\x80"), std::string("\xed\x9f\xbf"),
        std::string("\xee\x80\x80"), std::string("\xef\xbf\xbf"), std::string("\xf0\x90\x80\x80"),
        std::string("\xf4\x8f\xbf\xbf"), std::string("nul \0 inside", 12)}) {
    EXPECT_TRUE(is_valid_utf8(s)) << s;
    EXPECT_EQ(escape_invalid_utf8(s), s);
  }
}

TEST(Utf8Test, InvalidBytesAreEscapedOneByOne) {
  const struct {
    std::string in, out;
  } cases[] = {
      {"\xff", "\\xff"},
      {"a\xfe"
       "b",
       "a\\xfeb"},
      {"\x80", "\\x80"},                             // lone continuation byte
      {"x\xbf\xbfy", "x\\xbf\\xbfy"},                // two of them
      {"\xc3", "\\xc3"},                             // truncated at the end
      {"\xc3z", "\\xc3z"},                           // truncated, then ASCII
      {"\xe2\x82", "\\xe2\\x82"},                    // 3-byte lead, one continuation
      {"\xe2\x82\xc3\xa9", "\\xe2\\x82\xc3\xa9"},    // a valid character survives
      {"\xf0\x9f\x98", "\\xf0\\x9f\\x98"},           // 4-byte, truncated
      {"\xc0\xaf", "\\xc0\\xaf"},                    // overlong '/'
      {"\xc1\xbf", "\\xc1\\xbf"},                    // overlong
      {"\xe0\x80\xaf", "\\xe0\\x80\\xaf"},           // overlong 3-byte
      {"\xf0\x80\x80\xaf", "\\xf0\\x80\\x80\\xaf"},  // overlong 4-byte
      {"\xed\xa0\x80", "\\xed\\xa0\\x80"},           // U+D800, a surrogate
      {"\xed\xbf\xbf", "\\xed\\xbf\\xbf"},           // U+DFFF
      {"\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80"},  // U+110000
      {"\xf5\x80\x80\x80", "\\xf5\\x80\\x80\\x80"},  // lead byte never used
  };
  for (const auto& c : cases) {
    EXPECT_FALSE(is_valid_utf8(c.in)) << c.out;
    const std::string escaped = escape_invalid_utf8(c.in);
    EXPECT_EQ(escaped, c.out);
    EXPECT_TRUE(is_valid_utf8(escaped)) << c.out;
    EXPECT_EQ(escape_invalid_utf8(escaped), escaped) << "escaping twice changes " << c.out;
  }
}

TEST(Utf8Test, FirstInvalidIsAnOffset) {
  EXPECT_EQ(first_invalid_utf8("ok"), std::string_view::npos);
  EXPECT_EQ(first_invalid_utf8("ab\xc3\xa9\xff"), 4u);
  EXPECT_EQ(first_invalid_utf8("\xe2\x82"), 0u);
}

TEST(Utf8Test, EveryByteStringEscapesToValidText) {
  // All 2-byte inputs and a sweep of 3-byte ones: whatever comes in, what goes out is valid.
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      const std::string s = {static_cast<char>(a), static_cast<char>(b)};
      ASSERT_TRUE(is_valid_utf8(escape_invalid_utf8(s))) << a << " " << b;
    }
  }
  for (int a = 0xe0; a < 0x100; ++a) {
    for (int b = 0x70; b < 0xc8; ++b) {
      const std::string s = {static_cast<char>(a), static_cast<char>(b), '\x80'};
      ASSERT_TRUE(is_valid_utf8(escape_invalid_utf8(s))) << a << " " << b;
    }
  }
}

TEST(Utf8Test, PrefixNeverSplitsACharacter) {
  const std::string s = "ab\xc3\xa9\xe2\x82\xac";  // a b é €
  EXPECT_EQ(utf8_prefix(s, 100), s);
  EXPECT_EQ(utf8_prefix(s, 3), "ab");
  EXPECT_EQ(utf8_prefix(s, 4), "ab\xc3\xa9");
  EXPECT_EQ(utf8_prefix(s, 6), "ab\xc3\xa9");
  EXPECT_EQ(utf8_prefix(s, 7), s);
  EXPECT_EQ(utf8_prefix("a\xff\xff", 2), "a\xff");  // invalid bytes are single units
  EXPECT_EQ(utf8_prefix(s, 0), "");
}

}  // namespace
}  // namespace frt

#include "sha256.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace frt::detail {
namespace {

// FIPS 180-4 example vectors (NIST CSRC "SHA256.pdf", SHA-2 examples).
TEST(Sha256Test, EmptyString) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256Test, Abc) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256Test, TwoBlockMessage) {
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256Test, MillionAsInOddChunks) {
  // Chunks of 7 bytes cross every block boundary at a different offset.
  const std::string chunk(7, 'a');
  Sha256 s;
  size_t left = 1'000'000;
  while (left > 0) {
    const size_t n = std::min(left, chunk.size());
    s.update(chunk.data(), n);
    left -= n;
  }
  EXPECT_EQ(s.final_hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, FileMatchesBytesAndMissingFileIsNullopt) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("frt_sha256_test_" + std::to_string(::getpid()) + ".bin");
  std::string bytes;
  for (int i = 0; i < 200'000; ++i) bytes.push_back(static_cast<char>(i * 131 % 256));
  {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const auto from_file = sha256_file_hex(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(from_file.has_value());
  EXPECT_EQ(*from_file, sha256_hex(bytes));
  EXPECT_FALSE(sha256_file_hex(path).has_value());
}

}  // namespace
}  // namespace frt::detail

// SHA-256 (FIPS 180-4), used to check a kernel library against the digest in its metadata.json
// before it is dlopen'ed: a stale or swapped .so is refused instead of run.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace frt::detail {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  // Lower-case hex of the digest; the object must not be updated afterwards.
  std::string final_hex();

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string sha256_hex(std::string_view bytes);
// nullopt when the file cannot be read.
std::optional<std::string> sha256_file_hex(const std::filesystem::path& path);

}  // namespace frt::detail

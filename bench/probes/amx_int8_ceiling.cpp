// The machine's AMX-INT8 ceiling: each thread keeps four independent 16x16 int32 C tiles busy
// with tdpbusd on operands already in tile registers (no memory traffic), and the figure is
// 2 * 16 * 16 * 64 operations per tdpbusd over the wall time of all threads together. Built and
// run by bench/kernels.py --gemm-only (g++ -O2 -mamx-tile -mamx-int8 -pthread); prints one JSON
// line.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void spin(int64_t iters) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  _tile_loadconfig(&c);
  alignas(64) static thread_local int8_t bytes[16 * 64] = {1};
  _tile_loadd(4, bytes, 64);
  _tile_loadd(5, bytes, 64);
  _tile_loadd(6, bytes, 64);
  _tile_loadd(7, bytes, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  alignas(64) int32_t out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  if (out[0] == 12345) std::puts("");  // keeps the loop's result live
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int64_t iters = argc > 2 ? std::atoll(argv[2]) : 2000000;
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {  // ARCH_REQ_XCOMP_PERM, XTILEDATA
    std::printf("{\"error\": \"Linux refused the AMX tile state\"}\n");
    return 1;
  }
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(spin, iters);
    for (std::thread& t : pool) t.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double ops = 2.0 * 16 * 16 * 64 * 4 * static_cast<double>(iters) * threads;
    best = ops / s > best ? ops / s : best;
  }
  std::printf("{\"threads\": %d, \"int8_tops\": %.4f}\n", threads, best / 1e12);
  return 0;
}

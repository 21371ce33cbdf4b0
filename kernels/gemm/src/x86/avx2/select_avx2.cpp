// The avx2 variant's gemm table (Note [GEMM variants] in gemm_tiles.h).
#include "gemm_tiles.h"

namespace frt::kern {
const GemmTiles kGemmTiles = {quantize_row_u7_avx2,
                              w8a8_rows_tile_4x16_avx2,
                              quantize_row_s8_blocks_avx2,
                              w8a8_blocks_tile_4x16_avx2,
                              w4a8_blocks_tile_4x16_avx2,
                              w6a8_blocks_tile_4x16_avx2,
                              gemm_activate_avx2,
                              nullptr,
                              nullptr,
                              nullptr};
}  // namespace frt::kern

// The avx512vnni variant's gemm table (Note [GEMM variants] in gemm_tiles.h): the zmm quantizers
// and tiles and activation.
#include "gemm_tiles.h"

namespace frt::kern {
const GemmTiles kGemmTiles = {quantize_row_u7_zmm,
                              w8a8_rows_tile_4x16_zmm,
                              quantize_row_s8_blocks_zmm,
                              w8a8_blocks_tile_4x16_zmm,
                              w4a8_blocks_tile_4x16_zmm,
                              w6a8_blocks_tile_4x16_zmm,
                              gemm_activate_zmm,
                              nullptr,
                              nullptr,
                              nullptr};
}  // namespace frt::kern

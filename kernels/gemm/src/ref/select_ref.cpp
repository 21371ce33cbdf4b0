// The generic variant's gemm table (Note [GEMM variants] in gemm_tiles.h): the scalar reference.
#include "gemm_tiles.h"

namespace frt::kern {
const GemmTiles kGemmTiles = {quantize_row_u7_ref,
                              w8a8_rows_tile_4x16_ref,
                              quantize_row_s8_blocks_ref,
                              w8a8_blocks_tile_4x16_ref,
                              w4a8_blocks_tile_4x16_ref,
                              w6a8_blocks_tile_4x16_ref,
                              gemm_activate_ref,
                              nullptr,
                              nullptr,
                              nullptr};
}  // namespace frt::kern

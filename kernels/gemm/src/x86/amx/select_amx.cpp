// The amx variant's table: the avx512vnni variant's zmm paths, and the AMX-INT8 tiles for many
// rows of the per-row form (Note [AMX rows] in w8a8_rows_amx.cpp) and of the block forms (Note
// [AMX blocks] in blocks_amx.cpp).
#include "gemm_tiles.h"

namespace frt::kern {
const GemmTiles kGemmTiles = {quantize_row_u7_zmm,
                              w8a8_rows_tile_4x16_zmm,
                              quantize_row_s8_blocks_zmm,
                              w8a8_blocks_tile_4x16_zmm,
                              w4a8_blocks_tile_4x16_zmm,
                              w6a8_blocks_tile_4x16_zmm,
                              gemm_activate_zmm,
                              w8a8_rows_amx,
                              blocks_amx,
                              attention_amx};
}  // namespace frt::kern

// The amx variant's panel table: the avx512vnni variant's, plus the tile path for the int8
// panels from kTileRows rows (Note [Tile panels] in panels_amx.cpp).
#include <frt_kern/panels.h>

namespace frt::kern {
namespace {
constexpr int64_t kTileRows = 5;  // measured: 4 rows ran 25% slower on tiles, 5 rows 10% faster
}  // namespace
const PanelTable kPanels = {int8_panel_avx512, int8g_panel_avx512, int8s_panel_avx512,
                            int4_panel_avx512, int4s_panel_avx512, dot_f32_avx512,
                            dot_bf16_avx512,   activate_avx2,      tile_form_amx,
                            split_rows_amx,    int8_tiles_amx,     kTileRows};
}  // namespace frt::kern

// The amx variant's panel table: the avx512vnni variant's, plus the tile path for the weight-only
// panels (Note [Tile panels] in panels_amx.cpp; tile_from_amx says from how many rows).
#include <frt_kern/panels.h>

namespace frt::kern {
const PanelTable kPanels = {int8_panel_avx512, int8g_panel_avx512, int8s_panel_avx512,
                            int4_panel_avx512, int4s_panel_avx512, dot_f32_avx512,
                            dot_bf16_avx512,   activate_avx2,      tile_from_amx,
                            split_rows_amx,    tiles_amx};
}  // namespace frt::kern

// The avx2 variant's panel table.
#include <frt_kern/panels.h>

namespace frt::kern {
const PanelTable kPanels = {int8_panel_avx2,  int8g_panel_avx2, int8s_panel_avx2, int4_panel_avx2,
                            int4s_panel_avx2, dot_f32_avx2,     dot_bf16_avx2,    activate_avx2,
                            nullptr,          nullptr,          nullptr};
}  // namespace frt::kern

// The generic variant's panel table: the scalar reference only.
#include <frt_kern/panels.h>

namespace frt::kern {
const PanelTable kPanels = {int8_panel_ref,  int8g_panel_ref, int8s_panel_ref, int4_panel_ref,
                            int4s_panel_ref, dot_f32_ref,     dot_bf16_ref,    activate_ref,
                            nullptr,         nullptr,         nullptr};
}  // namespace frt::kern

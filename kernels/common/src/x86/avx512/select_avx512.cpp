// The avx512vnni variant's panel table: zmm panels and dot products, the AVX2 activations.
#include <frt_kern/panels.h>

namespace frt::kern {
const PanelTable kPanels = {int8_panel_avx512,
                            int8g_panel_avx512,
                            int8s_panel_avx512,
                            int4_panel_avx512,
                            int4s_panel_avx512,
                            dot_f32_avx512,
                            dot_bf16_avx512,
                            activate_avx2,
                            nullptr,
                            nullptr,
                            nullptr};
}  // namespace frt::kern

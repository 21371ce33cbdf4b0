// The generic variant's panel table: the scalar reference only.
#include <frt_kern/panels.h>

namespace frt::kern {
const PanelTable kPanels = {int8_panel_ref, int4_panel_ref};
}  // namespace frt::kern

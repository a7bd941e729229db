/* Compiled as strict C99 with the build: colibri.h must stay a plain C header. */
#include "colibri/colibri.h"

int colibri_header_check(void);
int colibri_header_check(void) {
  colibri_inference_params params;
  colibri_router_config config;
  colibri_model_stats stats;
  params.struct_size = sizeof params;
  config.struct_size = sizeof config;
  stats.struct_size = sizeof stats;
  return (int)(params.struct_size + config.struct_size + stats.struct_size) + COLIBRI_OK + COLIBRI_ABI_VERSION;
}

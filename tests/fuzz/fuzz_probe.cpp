// libFuzzer target: the header probe must return a status for any bytes, never read outside them.
#include <cstdint>
#include <cstdlib>

#include "probe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lazymedia::ProbeResult r = lazymedia::probe_image(data, size);
  if (r.status == lazymedia::ProbeStatus::Ok && (r.width == 0 || r.height == 0)) std::abort();
  if (r.orientation < 1 || r.orientation > 8) std::abort();
  return 0;
}

// fa3 — the key of a tuning cache for a device, and where its file lives.
#pragma once

#include "fa3/device.h"
#include "fa3/tune.h"

namespace fa3 {

// The key of the cache for `device` with this build: its name and SM count, the CUDA
// driver's version, and fa3's version.
TuneKey tune_key_of(const DeviceInfo& device);

}  // namespace fa3

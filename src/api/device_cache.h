// fa3 — properties of the current device, queried once per device.
#pragma once

#include "fa3/device.h"
#include "fa3/status.h"

namespace fa3 {

// Points `*info` at the cached properties of the current CUDA device.
Status current_device_cached(const DeviceInfo** info);

}  // namespace fa3

// fa3 — exact, IO-aware attention for NVIDIA Hopper GPUs. Include this header for
// the whole public API.
#pragma once

#include "fa3/attention.h"
#include "fa3/cpu.h"
#include "fa3/device.h"
#include "fa3/fp8.h"
#include "fa3/kernels.h"
#include "fa3/kvcache.h"
#include "fa3/merge.h"
#include "fa3/status.h"
#include "fa3/tensor.h"
#include "fa3/tune.h"

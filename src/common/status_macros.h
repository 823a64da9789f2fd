// fa3 — early return on a failed Status.
#pragma once

#include "fa3/status.h"

#define FA3_RETURN_IF_ERROR(expr)             \
  do {                                        \
    ::fa3::Status fa3_status_ = (expr);       \
    if (!fa3_status_.is_ok()) return fa3_status_; \
  } while (0)

// fa3 program — how failures travel to main() and which exit status each gets.
#pragma once

#include <stdexcept>
#include <string>

#include "fa3/status.h"

namespace fa3::cli {

enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,        // the library, CUDA or the host refused or failed
  kExitUsage = 2,        // bad command line
  kExitCheckFailed = 3,  // the run finished but its result is wrong
};

// A bad command line: main() prints the message and the command's usage, exit 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A failure while doing the work (a Status that is not ok, a CUDA error): exit 1.
class RunError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Turns a failed Status into a RunError carrying its full text.
inline void throw_if_error(const Status& status) {
  if (!status.is_ok()) throw RunError(status.to_string());
}

}  // namespace fa3::cli

#include "api/autotune_switch.h"

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <string>

#include "fa3/tune.h"

namespace fa3 {
namespace {

// One relaxed atomic load per fa3::forward call: the switch guards no data, it only
// picks a path, and a call racing with set_autotune may take either. The environment is
// read once, on the first use.
std::atomic<bool>& autotune_state() {
  static std::atomic<bool> enabled{autotune_env_enables(std::getenv("FA3_AUTOTUNE"))};
  return enabled;
}

}  // namespace

bool autotune_env_enables(const char* value) {
  if (value == nullptr) return false;
  std::string v(value);
  for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

void set_autotune(bool enabled) { autotune_state().store(enabled, std::memory_order_relaxed); }

bool autotune_enabled() { return autotune_state().load(std::memory_order_relaxed); }

}  // namespace fa3

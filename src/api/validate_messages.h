// fa3 — how validation rules word their messages: the argument's name, the rule, and
// the values that broke it, shared by every file of rules.
//
// Messages are built with std::to_string / snprintf rather than iostreams: the
// library runs inside other runtimes (Python extensions) whose iostream state it
// must not depend on, and formatting happens only when a rule is broken.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "fa3/status.h"
#include "fa3/tensor.h"

namespace fa3::detail {

inline std::string str(const char* v) { return v; }
inline std::string str(const std::string& v) { return v; }
inline std::string str(std::int64_t v) { return std::to_string(v); }
inline std::string str(int v) { return std::to_string(v); }
inline std::string str(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}

template <class... Parts>
std::string cat(const Parts&... parts) {
  return (std::string() + ... + str(parts));
}

inline std::string shape_string(const TensorView& t) {
  std::string s = "(";
  for (int d = 0; d < t.rank; ++d) s += (d ? ", " : "") + str(t.shape[d]);
  return s + ")";
}

inline Status invalid(const std::string& msg) { return {StatusCode::kInvalidArgument, msg}; }
inline Status unsupported(const std::string& msg) { return {StatusCode::kNotSupported, msg}; }

}  // namespace fa3::detail

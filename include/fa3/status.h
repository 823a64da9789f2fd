// fa3 — status values returned by every public entry point.
#pragma once

#include <string>
#include <utility>

namespace fa3 {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the call broke a documented rule; nothing was written
  kNotSupported,     // the call is valid but asks for something not built or not implemented
  kCudaError,        // a CUDA runtime call failed
  kInternal,         // a bug in fa3
};

const char* status_code_name(StatusCode code);

// A status is cheap to return: an OK status holds no message.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "invalid argument: k: head dim 72 is not supported; ..."
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace fa3

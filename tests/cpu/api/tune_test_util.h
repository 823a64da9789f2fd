// Helpers for the tuning cache's tests: environment variables set for one test, a
// scratch directory, and a key and entries to write.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "fa3/tune.h"

namespace fa3::test {

// Sets (or, with nullopt, unsets) an environment variable, restoring it on destruction.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    apply(value);
  }
  ~ScopedEnv() { apply(old_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void apply(const std::optional<std::string>& value) {
    if (value) {
      setenv(name_.c_str(), value->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

  std::string name_;
  std::optional<std::string> old_;
};

// A fresh directory under the test temp directory, removed with its contents.
class ScratchDir {
 public:
  ScratchDir() {
    static int counter = 0;
    path_ = ::testing::TempDir() + "fa3_tune_" + std::to_string(getpid()) + "_" + std::to_string(counter++);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // The names in the directory, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::string path_;
};

inline TuneKey test_key() {
  TuneKey key;
  key.gpu_name = "NVIDIA H200";
  key.sm_count = 132;
  key.cuda_driver = 13000;
  key.fa3_version = "0.1.0";
  return key;
}

// A valid entry; `seqlen` picks its class (a power of two).
inline TuneEntry test_entry(std::int64_t seqlen, const std::string& kernel = "128x128-c2", bool causal = false) {
  TuneEntry e;
  e.cls.dtype = DType::kBFloat16;
  e.cls.head_dim = 128;
  e.cls.causal = causal;
  e.cls.seqlen_q = seqlen;
  e.cls.seqlen_k = seqlen;
  e.cls.gqa = 1;
  e.kernel = kernel;
  // Times exact in binary, so that their text is short and known.
  e.kernel_ms = 0.5 * static_cast<double>(seqlen) / 1024;
  e.heuristic = "128x128";
  e.heuristic_ms = 1.25 * e.kernel_ms;
  return e;
}

inline bool same_entries(const std::vector<TuneEntry>& a, const std::vector<TuneEntry>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].cls != b[i].cls || a[i].kernel != b[i].kernel || a[i].kernel_ms != b[i].kernel_ms ||
        a[i].heuristic != b[i].heuristic || a[i].heuristic_ms != b[i].heuristic_ms) {
      return false;
    }
  }
  return true;
}

}  // namespace fa3::test

// Runs the built `fa3` program (its path comes from the build: FA3_CLI_PATH) and
// captures its exit status, stdout and stderr.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace fa3::test {

struct CliResult {
  int exit_code = -1;  // -1: killed by a signal (a crash)
  std::string out;
  std::string err;
};

// A path under the test temp directory that no other test process uses.
inline std::string temp_path(const std::string& name) {
  static int counter = 0;
  return ::testing::TempDir() + "fa3_cli_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + "_" + name;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// `args` is appended to the command line as is: callers pass plain words.
inline CliResult run_cli(const std::string& args) {
  const std::string err_path = temp_path("stderr");
  const std::string command = std::string("'") + FA3_CLI_PATH + "' " + args + " 2>'" + err_path + "'";
  CliResult r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_file(err_path);
  std::remove(err_path.c_str());
  return r;
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

inline bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

}  // namespace fa3::test

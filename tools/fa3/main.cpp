// fa3 — the command-line program: `fa3 info`, `fa3 run`, `fa3 bench`, `fa3 tune`.
//
// Every failure ends here as an exit status and a message on stderr; no exception
// leaves main().
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "commands.h"
#include "errors.h"
#include "flags.h"
#include "usage.h"

namespace fa3::cli {
namespace {

struct Command {
  const char* name;
  const char* (*usage)();
  int (*run)(const std::vector<std::string>& args);
};

constexpr Command kCommands[] = {
    {"info", info_usage, info_command},
    {"run", run_usage, run_command},
    {"bench", bench_usage, bench_command},
    {"tune", tune_usage, tune_command},
};

int usage_error(const std::string& prefix, const std::string& message, const char* usage) {
  std::fprintf(stderr, "%s: error: %s\n\n%s", prefix.c_str(), message.c_str(), usage);
  return kExitUsage;
}

int dispatch(const std::vector<std::string>& args) {
  if (args.empty()) return usage_error("fa3", "no command given", main_usage());
  const std::string& name = args.front();
  if (name == "-h" || name == "--help" || name == "help") {
    std::fputs(main_usage(), stdout);
    return kExitOk;
  }
  for (const Command& cmd : kCommands) {
    if (name != cmd.name) continue;
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    const std::string prefix = std::string("fa3 ") + cmd.name;
    if (asks_for_help(rest)) {
      std::fputs(cmd.usage(), stdout);
      return kExitOk;
    }
    try {
      return cmd.run(rest);
    } catch (const UsageError& e) {
      return usage_error(prefix, e.what(), cmd.usage());
    } catch (const RunError& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "%s: %s\n", prefix.c_str(), e.what());
      return kExitError;
    }
  }
  return usage_error("fa3", "unknown command '" + name + "'", main_usage());
}

}  // namespace
}  // namespace fa3::cli

int main(int argc, char** argv) {
  try {
    return fa3::cli::dispatch(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "fa3: out of host memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fa3: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "fa3: unexpected failure\n");
  }
  return fa3::cli::kExitError;
}

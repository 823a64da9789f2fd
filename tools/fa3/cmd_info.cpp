#include <cstdio>
#include <string>
#include <vector>

#include "api/validate.h"
#include "commands.h"
#include "device_choice.h"
#include "errors.h"
#include "fa3/device.h"
#include "flags.h"
#include "format.h"

namespace fa3::cli {
namespace {

void line(const char* key, const std::string& value) { std::printf("  %-15s %s\n", key, value.c_str()); }

void print_build(const BuildInfo& b) {
  std::printf("build\n");
  line("CUDA toolkit", b.cuda_version);
  line("CUTLASS", b.cutlass_version);
  if (b.gpu_kernels) {
    line("GPU kernels", "head dims " + join(b.head_dims) + "; dtypes " + join(b.dtypes));
  } else {
    line("GPU kernels", "none (built without GPU kernels)");
  }
  const ValidationTarget cpu = cpu_target();
  std::vector<std::string> dtypes;
  for (DType d : cpu.dtypes) dtypes.push_back(dtype_name(d));
  line("CPU path", "dtypes " + join(dtypes) + "; head dims 1 to " + std::to_string(cpu.max_head_dim) +
                       ", V head dims (v, out) 1 to " + std::to_string(cpu.max_head_dim_v));
}

void print_device(const DeviceInfo& d) {
  std::printf("device\n");
  if (!d.present) {
    line("GPU", "none: " + d.error);
  } else {
    line("GPU", d.name + " (device " + std::to_string(d.index) + ")");
    line("compute cap.", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor));
    line("SMs", std::to_string(d.sm_count));
    line("memory", bytes_text(static_cast<double>(d.global_memory_bytes)) + ", L2 " +
                       bytes_text(d.l2_bytes) + ", shared memory per block " +
                       bytes_text(d.max_smem_per_block_optin));
  }
  const std::string unusable = gpu_unusable_reason(d);
  line("kernels run", unusable.empty() ? "yes: `fa3 run` uses the GPU"
                                       : "no: " + unusable + "; `fa3 run` uses the CPU path");
}

}  // namespace

int info_command(const std::vector<std::string>& args) {
  apply_flags(args, {});
  const BuildInfo& build = build_info();
  std::printf("fa3 %s\n", build.version.c_str());
  print_build(build);
  print_device(current_device());
  return kExitOk;
}

}  // namespace fa3::cli

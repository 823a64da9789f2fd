#include "hopper/timeline_capture.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "hopper/launch_util.h"
#include "hopper/timeline.h"

namespace fa3::hopper {

Status timeline_begin(int grid, int warpgroups, cudaStream_t stream, TimelineCapture* capture) {
  *capture = {};
  const char* path = std::getenv("FA3_FWD_TIMELINE");
  if (path == nullptr || *path == '\0') return Status::ok();
  // A launch captured into a graph cannot read its stamps back: it records none.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  Status st = detail::cuda_status(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing (timeline)");
  if (!st.is_ok() || capturing != cudaStreamCaptureStatusNone) return st;
  TimelineCapture c;
  c.path = path;
  c.warpgroups = warpgroups;
  c.streams = grid * warpgroups;
  c.capacity = timeline_capacity(c.streams);
  const std::size_t bytes = static_cast<std::size_t>(c.streams) * timeline_stream_words(c.capacity) * 8;
  void* buffer = nullptr;
  st = detail::cuda_status(cudaMallocAsync(&buffer, bytes, stream), "cudaMallocAsync (timeline)");
  if (!st.is_ok()) return st;
  st = detail::cuda_status(cudaMemsetAsync(buffer, 0, bytes, stream), "cudaMemsetAsync (timeline)");
  if (!st.is_ok()) {
    cudaFreeAsync(buffer, stream);
    return st;
  }
  c.buffer = static_cast<std::uint64_t*>(buffer);
  *capture = c;
  return Status::ok();
}

Status timeline_end(const TimelineCapture& capture, const char* kernel, int block_n, cudaStream_t stream) {
  if (capture.buffer == nullptr) return Status::ok();
  const std::size_t words = static_cast<std::size_t>(capture.streams) * timeline_stream_words(capture.capacity);
  std::vector<std::uint64_t> host(words);
  Status st =
      detail::cuda_status(cudaMemcpyAsync(host.data(), capture.buffer, words * 8, cudaMemcpyDeviceToHost, stream),
                          "cudaMemcpyAsync (timeline)");
  const Status freed = detail::cuda_status(cudaFreeAsync(capture.buffer, stream), "cudaFreeAsync (timeline)");
  if (st.is_ok()) st = detail::cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize (timeline)");
  if (!st.is_ok()) return st;
  if (!freed.is_ok()) return freed;

  TimelineHeader header{};
  std::memcpy(header.magic, kTimelineMagic, sizeof(header.magic));
  header.streams = static_cast<std::uint32_t>(capture.streams);
  header.warpgroups = static_cast<std::uint32_t>(capture.warpgroups);
  header.capacity = static_cast<std::uint32_t>(capture.capacity);
  header.block_n = static_cast<std::uint32_t>(block_n);
  int device = 0;
  int clock_khz = 0;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device) != cudaSuccess) {
    clock_khz = 0;
  }
  header.clock_khz = static_cast<std::uint32_t>(clock_khz);
  header.name_bytes = static_cast<std::uint32_t>(std::strlen(kernel));

  std::FILE* file = std::fopen(capture.path.c_str(), "ab");
  if (file == nullptr) {
    return {StatusCode::kInvalidArgument, "FA3_FWD_TIMELINE: cannot open " + capture.path + " to append"};
  }
  const bool written = std::fwrite(&header, sizeof(header), 1, file) == 1 &&
                       std::fwrite(kernel, 1, header.name_bytes, file) == header.name_bytes &&
                       std::fwrite(host.data(), 8, words, file) == words;
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed) return {StatusCode::kInvalidArgument, "FA3_FWD_TIMELINE: cannot write " + capture.path};
  return Status::ok();
}

}  // namespace fa3::hopper

#include "cuda_resources.h"

#include <string>
#include <utility>

#include "errors.h"

namespace fa3::cli {

void cuda_check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  throw RunError(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(err) + " (" +
                 cudaGetErrorString(err) + ")");
}

// Destructors cannot report: a failed free at exit changes nothing the user can act on,
// so its status is dropped (and cleared, so it does not surface in a later check).

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  cuda_check(cudaMalloc(&ptr_, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr && cudaFree(ptr_) != cudaSuccess) cudaGetLastError();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr && cudaFree(ptr_) != cudaSuccess) cudaGetLastError();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

CudaStream::CudaStream() { cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"); }

CudaStream::~CudaStream() {
  if (cudaStreamDestroy(stream_) != cudaSuccess) cudaGetLastError();
}

CudaEvent::CudaEvent() { cuda_check(cudaEventCreate(&event_), "cudaEventCreate"); }

CudaEvent::~CudaEvent() {
  if (event_ != nullptr && cudaEventDestroy(event_) != cudaSuccess) cudaGetLastError();
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

}  // namespace fa3::cli

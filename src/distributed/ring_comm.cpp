#include "distributed/ring_comm.h"

#include <string>

#include "common/status_macros.h"

namespace fa3::distributed::detail {

Status nccl_status(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return Status::ok();
  return {StatusCode::kCudaError, std::string(what) + ": " + ncclGetErrorString(result)};
}

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(err)};
}

Status ring_of(ncclComm_t comm, Ring* ring) {
  if (comm == nullptr) return {StatusCode::kInvalidArgument, "comm: required, got a null communicator"};
  FA3_RETURN_IF_ERROR(nccl_status(ncclCommUserRank(comm, &ring->rank), "ncclCommUserRank"));
  FA3_RETURN_IF_ERROR(nccl_status(ncclCommCount(comm, &ring->size), "ncclCommCount"));
  ring->next = (ring->rank + 1) % ring->size;
  ring->prev = (ring->rank + ring->size - 1) % ring->size;
  return Status::ok();
}

Status exchange(std::initializer_list<Transfer> transfers, const Ring& ring, ncclComm_t comm, cudaStream_t stream) {
  FA3_RETURN_IF_ERROR(nccl_status(ncclGroupStart(), "ncclGroupStart"));
  ncclResult_t result = ncclSuccess;
  for (const Transfer& t : transfers) {
    if (result == ncclSuccess) result = ncclSend(t.send, t.bytes, ncclUint8, ring.next, comm, stream);
    if (result == ncclSuccess) result = ncclRecv(t.receive, t.bytes, ncclUint8, ring.prev, comm, stream);
  }
  // The group is closed whatever happened inside it.
  const ncclResult_t ended = ncclGroupEnd();
  FA3_RETURN_IF_ERROR(nccl_status(result, "ncclSend/ncclRecv"));
  return nccl_status(ended, "ncclGroupEnd");
}

Status exchange_shard(const KvShard& send, const KvShard& receive, const Ring& ring, ncclComm_t comm,
                      cudaStream_t stream) {
  const auto bytes = [](const TensorView& t) { return static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype); };
  return exchange({{send.k.data, receive.k.data, bytes(send.k)}, {send.v.data, receive.v.data, bytes(send.v)}}, ring,
                  comm, stream);
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

Status Event::create() {
  return cuda_status(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
}

Status Event::record(cudaStream_t stream) { return cuda_status(cudaEventRecord(event_, stream), "cudaEventRecord"); }

Status Event::wait(cudaStream_t stream) const {
  return cuda_status(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
}

}  // namespace fa3::distributed::detail

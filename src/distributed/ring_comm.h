// fa3 — what both directions of ring attention (fa3/distributed.h) need of NCCL and
// CUDA: the ring of ranks around a communicator, one hop of buffers to the next rank,
// events, and errors as Status.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <initializer_list>

#include "distributed/ring_plan.h"
#include "fa3/status.h"

namespace fa3::distributed::detail {

Status nccl_status(ncclResult_t result, const char* what);
Status cuda_status(cudaError_t err, const char* what);

// This rank's place in the communicator's ring: it sends to next and receives from prev.
struct Ring {
  int rank = 0, size = 1, next = 0, prev = 0;
};
Status ring_of(ncclComm_t comm, Ring* ring);

// One buffer of a hop: `send` goes to the next rank while the previous rank's buffer of
// the same size arrives in `receive`.
struct Transfer {
  const void* send;
  void* receive;
  std::size_t bytes;
};

// One grouped ncclSend / ncclRecv of every transfer on `stream`.
Status exchange(std::initializer_list<Transfer> transfers, const Ring& ring, ncclComm_t comm, cudaStream_t stream);

// The hop of a K/V shard: `send` to the next rank, the previous rank's into `receive`
// (contiguous, of send's shapes).
Status exchange_shard(const KvShard& send, const KvShard& receive, const Ring& ring, ncclComm_t comm,
                      cudaStream_t stream);

// An event of one call, destroyed when it returns (its recorded work may still be
// pending: CUDA releases it once that is done). Timing off: it only orders streams.
class Event {
 public:
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();
  Status create();
  Status record(cudaStream_t stream);
  // `stream` waits for the work recorded last before this call.
  Status wait(cudaStream_t stream) const;

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace fa3::distributed::detail

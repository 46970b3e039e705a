// The one-rank fake NCCL of fake_nccl.hpp.
#include "fake_nccl.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

struct ncclComm {
  fake_nccl::script script;
  fake_nccl::counts counts;
  ncclResult_t async_error = ncclSuccess;
  int polls_left = 0;  // ncclCommGetAsyncError's ncclInProgress answers still to give
  bool in_progress = false;
};

namespace {

fake_nccl::script next_script;

struct pending_op {
  ncclComm_t comm;
  void* buffer;
  std::size_t bytes;
  cudaStream_t stream;
};

// ncclGroupStart's nesting, the communicator the group's calls were made on, and its
// point-to-point calls, per thread, as NCCL keeps them.
thread_local int group_depth = 0;
thread_local ncclComm_t group_comm = nullptr;
thread_local std::vector<pending_op> sends, recvs;

std::size_t type_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

/// A call's start: counts one made before the last finished, and starts this one's progress (a
/// call inside a group is in progress from the group's end).
ncclResult_t issue(ncclComm_t comm) {
  if (comm->in_progress) ++comm->counts.calls_while_in_progress;
  if (group_depth > 0) {
    group_comm = comm;
    return ncclSuccess;
  }
  if (comm->script.in_progress_polls == 0) return ncclSuccess;
  comm->in_progress = true;
  comm->polls_left = comm->script.in_progress_polls;
  return ncclInProgress;
}

ncclResult_t copy(ncclComm_t comm, void* to, const void* from, std::size_t bytes, cudaStream_t stream) {
  if (to == from || bytes == 0) return issue(comm);
  if (cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess) return ncclInvalidArgument;
  return issue(comm);
}

}  // namespace

namespace fake_nccl {
void use(script s) { next_script = s; }
void fail(ncclComm_t comm, ncclResult_t error) { comm->async_error = error; }
counts seen(ncclComm_t comm) { return comm->counts; }
}  // namespace fake_nccl

extern "C" {

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unhandled error";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  return comm != nullptr && comm->async_error != ncclSuccess ? "fake: rank 1 stopped answering" : "";
}

ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int*) {
  if (ndev != 1) return ncclInvalidArgument;
  *comm = new ncclComm{next_script, {}, ncclSuccess, 0, false};
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  ++comm->counts.async_error_queries;
  if (comm->in_progress && comm->polls_left-- > 0) {
    *state = ncclInProgress;
  } else {
    comm->in_progress = false;
    *state = comm->async_error;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = 0;
  return issue(comm);
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  *count = 1;
  return issue(comm);
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  if (op != ncclSum || type_bytes(type) == 0) return ncclInvalidArgument;
  return copy(comm, recv, send, count * type_bytes(type), stream);
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  if (type_bytes(type) == 0) return ncclInvalidArgument;
  return copy(comm, recv, send, count * type_bytes(type), stream);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (root != 0 || type_bytes(type) == 0) return ncclInvalidArgument;
  return copy(comm, recv, send, count * type_bytes(type), stream);
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (peer != 0 || type_bytes(type) == 0) return ncclInvalidArgument;
  if (group_depth == 0) return ncclInvalidUsage;  // a send to oneself outside a group never completes
  sends.push_back({comm, const_cast<void*>(send), count * type_bytes(type), stream});
  return issue(comm);
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  if (peer != 0 || type_bytes(type) == 0) return ncclInvalidArgument;
  if (group_depth == 0) return ncclInvalidUsage;
  recvs.push_back({comm, recv, count * type_bytes(type), stream});
  return issue(comm);
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

/// The outermost end pairs the group's sends with its receives, in order, and copies each; the
/// group is then one call in progress on its communicator.
ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  std::vector<pending_op> s, r;
  s.swap(sends);
  r.swap(recvs);
  const ncclComm_t comm = std::exchange(group_comm, nullptr);
  if (s.size() != r.size()) return ncclInvalidUsage;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i].bytes != r[i].bytes || s[i].comm != r[i].comm) return ncclInvalidUsage;
    if (cudaMemcpyAsync(r[i].buffer, s[i].buffer, s[i].bytes, cudaMemcpyDeviceToDevice, s[i].stream) != cudaSuccess) {
      return ncclInvalidArgument;
    }
  }
  return comm == nullptr ? ncclSuccess : issue(comm);
}

}  // extern "C"

// A one-rank NCCL for the SIMT backend (fake_nccl.cpp defines NCCL's functions): collectives
// are copies on the caller's stream, and a script makes a communicator behave as a nonblocking
// one (every call in progress for a while) or report an asynchronous error, which a GPU cannot
// be made to do on demand. Every buffer must be device memory (the copies check it).
#pragma once

#include <nccl.h>

namespace fake_nccl {

/// What a fake communicator does.
struct script {
  /// When > 0, each call (outside a group) and ncclGroupEnd returns ncclInProgress, and
  /// ncclCommGetAsyncError then reports ncclInProgress this many times before ncclSuccess, as a
  /// nonblocking communicator does.
  int in_progress_polls = 0;
};

/// The script of the communicators that ncclCommInitAll creates from now on.
void use(script s);

/// From now on ncclCommGetAsyncError reports `error` on comm once nothing is in progress: a
/// peer's or the network's failure (ncclRemoteError, say), which real NCCL reports while the
/// collectives it broke, and so their stream, never finish.
void fail(ncclComm_t comm, ncclResult_t error);

/// What a communicator saw.
struct counts {
  int async_error_queries = 0;
  /// Calls made while an earlier call was still in progress (NCCL forbids them).
  int calls_while_in_progress = 0;
};
counts seen(ncclComm_t comm);

}  // namespace fake_nccl

// names.hpp's names, plus those of the CUDA examples (device memory, a stream, NCCL).
#pragma once

#include "names.hpp"

#include <gradzip/comm/nccl.cuh>
#include <gradzip/gradzip.cuh>

extern cudaStream_t stream;                    // the stream the work is ordered on
extern gradzip::cuda cuda_exec;                // gradzip::cuda{stream}
extern gradzip::span<float> d_grad;            // the gradient, n values in device memory
extern gradzip::span<float> d_accum;           // device memory, n values
extern gradzip::span<std::byte> d_out;         // device memory, codec.max_compressed_bytes<float>(n)
extern gradzip::span<const std::byte> d_payload;  // a payload in device memory
extern gradzip::span<std::byte> d_table;       // device memory for a count sketch's table
extern gradzip::span<const std::byte> d_other; // another worker's table, device memory
extern gradzip::span<std::byte> d_top;         // device memory for unsketch's payload
extern gradzip::span<const std::uint64_t> d_nonzero_indices;  // a rank's nonzeros: increasing, < n, device memory
extern gradzip::span<const float> d_nonzero_values;            // their values, device memory
extern ncclUniqueId nccl_id;                   // from ncclGetUniqueId on rank 0, broadcast
extern int ranks;                              // NCCL ranks
extern int rank;                               // this process's NCCL rank

// The names that gradzip's documentation uses in its examples without declaring them, declared
// here so that tools/snippets.py can compile every example (ctest "snippets: ..."). Read an
// example's `grad` as "your gradient", and so on. Fragments are compiled, not run, so these are
// declarations only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <gradzip/gradzip.hpp>
#if GRADZIP_SNIPPETS_MPI
#define OMPI_SKIP_MPICXX 1  // MPI's C API only (its C++ bindings warn under -Wextra)
#define MPICH_SKIP_MPICXX 1
#include <gradzip/comm/mpi.hpp>
#endif

extern std::size_t n;                 // elements in the tensor
extern std::size_t k;                 // elements to keep
extern std::uint64_t seed;            // a seed every worker shares
extern std::uint64_t step;            // the training step
extern std::uint64_t tensor_id;       // the tensor's index in the model
extern int workers;                   // ranks in the job
extern float lr;                      // learning rate
extern gradzip::host exec;            // the host executor
extern std::vector<float> grad;       // this worker's gradient, n values
extern std::vector<float> accum;      // where decoded payloads are added, n values
extern std::vector<float> weights;    // the model's parameters, n values
extern std::vector<std::byte> out;    // a buffer of the codec's max_compressed_bytes
extern std::vector<std::byte> payload;  // a payload received from a peer
extern std::vector<gradzip::span<const std::byte>> gathered_payloads;  // every worker's payload, allgathered
extern std::vector<float> average;    // the average over ranks of decoded payloads, n values
extern std::vector<float> bucket;     // a bucket of gradients: tensors back to back
extern gradzip::comm::communicator& comm;  // MPI, NCCL or your own (docs/communication.md)
extern std::vector<std::uint64_t> indices;  // this rank's nonzeros, increasing, < n (sparse_sync)
extern std::vector<float> values;     // their values
extern std::vector<std::size_t> sizes;      // a model's tensor sizes, in backprop order
extern std::vector<double> backward_seconds;  // each tensor's backward compute time
extern double forward_seconds;              // the forward pass's time
extern gradzip::schedule::workload w;       // sizes and backward times (schedule/timeline.hpp)
extern gradzip::schedule::cost_model model;  // a calibrated cost model (schedule/cost_model.hpp)
extern std::vector<gradzip::schedule::option> options;  // the ways a group may be synchronized
extern gradzip::schedule::plan plan;        // groups and options, from a planner or plan_from_json
extern std::string plan_json, cost_json;    // a plan and a cost model as JSON text (gradzip_plan)

using codec_t = gradzip::codec<gradzip::sparsify::topk, gradzip::quantize::none, gradzip::encode::coo>;
extern const codec_t codec;           // a codec chosen elsewhere

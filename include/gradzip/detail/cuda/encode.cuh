// index_encoder<cuda>: staged index encodings (bitmap, delta-varint, automatic) written from the
// sorted indices compress leaves in device scratch, and the kernels that decode them.
//
// Encoding: COO one thread per index; the bitmap by 32-bit atomicOr into a zeroed section (OR
// commutes, so the bytes do not depend on the order); delta-varint one thread per 1024-index
// chunk, after a device scan of the chunks' data sizes. Only delta-varint's size depends on the
// data: measuring it costs one copy of the total to the host (a sync), as a threshold count does.
//
// Decoding: the bitmap's per-word bit counts are scanned on the device, then one thread per
// 64-bit word accumulates its elements; delta-varint decodes one chunk per thread, once to
// validate and once to accumulate. The same format functions (encode/*.hpp) run on both
// executors, so the bytes and the checks are the host's.
#pragma once

#include <cub/device/device_scan.cuh>

#include "gradzip/encode/automatic.hpp"

namespace gradzip::detail {

/// The index encoders (COO, bitmap, delta-varint): one index or chunk per thread and
/// grid-stride step.
using index_encode_policy = launch_policy<256, 1, 8>;

template <class = void>
__global__ __launch_bounds__(index_encode_policy::threads)
void delta_sizes_kernel(const std::uint64_t* idx, std::uint64_t k, int width,
                        std::uint64_t chunks, std::uint64_t* sizes) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t c = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c <= chunks;
       c += stride) {
    sizes[c] = c < chunks ? encode::delta_varint::chunk_data_bytes(idx, k, width, c) : 0;
  }
}

template <class = void>
__global__ __launch_bounds__(index_encode_policy::threads)
void delta_write_kernel(std::uint8_t* section, const std::uint64_t* idx, std::uint64_t k,
                        int width, std::uint64_t chunks, const std::uint64_t* offsets) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t c = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += stride) {
    encode::delta_varint::write_chunk(section, idx, k, width, c, offsets[c]);
  }
}

template <class = void>
__global__ __launch_bounds__(index_encode_policy::threads)
void coo_write_kernel(std::uint8_t* section, const std::uint64_t* idx, std::uint64_t k,
                      int width) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < k; j += stride) {
    encode::coo::store(section, width, j, idx[j]);
  }
}

template <class = void>
__global__ __launch_bounds__(index_encode_policy::threads)
void bitmap_set_kernel(std::uint8_t* section, const std::uint64_t* idx, std::uint64_t k) {
  auto* words = reinterpret_cast<unsigned int*>(section);  // little-endian: bit i of the section
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < k; j += stride) {
    atomicOr(words + idx[j] / 32, 1u << (idx[j] % 32));
  }
}

template <>
struct index_encoder<cuda> {
  /// Scratch: delta-varint's chunk sizes and offsets (chunks + 1 each), then CUB's scan storage.
  static std::size_t workspace_bytes(cuda& exec, std::uint64_t k) {
    const std::uint64_t entries = encode::delta_varint::chunks(k) + 1;
    return 2 * entries * sizeof(std::uint64_t) + 256 + exclusive_sum_bytes(exec, entries);
  }

  template <class Indices>
  static std::uint64_t plan(cuda& exec, const std::uint64_t* idx, std::uint64_t k, std::uint64_t n,
                            std::byte* ws, std::uint8_t& encoding) {
    return encode::plan_section<Indices>(k, n, [&] { return measure_delta(exec, idx, k, n, ws); }, encoding);
  }

  static void encode(cuda& exec, std::uint8_t encoding, const std::uint64_t* idx, std::uint64_t k,
                     std::uint64_t n, std::byte* ws, std::uint8_t* section) {
    if (encoding == encode::coo::id) {
      if (k == 0) return;
      launch_over<index_encode_policy>(exec, k, coo_write_kernel<>, section, idx, k,
                                       encode::coo::index_width(n));
    } else if (encoding == encode::bitmap::id) {
      GRADZIP_CUDA_TRY(cudaMemsetAsync(section, 0, encode::bitmap::section_bytes(k, n), exec.stream()));
      if (k == 0) return;
      launch_over<index_encode_policy>(exec, k, bitmap_set_kernel<>, section, idx, k);
    } else {
      const std::uint64_t chunks = encode::delta_varint::chunks(k);
      if (chunks == 0) return;
      const auto* offsets = reinterpret_cast<const std::uint64_t*>(ws) + chunks + 1;
      launch_over<index_encode_policy>(exec, chunks, delta_write_kernel<>, section, idx, k,
                                       encode::delta_varint::gap_width(n), chunks, offsets);
    }
  }

  static void copy(cuda& exec, std::uint8_t* to, const std::uint8_t* from, std::size_t bytes) {
    if (bytes != 0) GRADZIP_CUDA_TRY(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, exec.stream()));
  }

  /// Queues delta-varint's measurement of idx into ws (as plan does) and a copy of its data
  /// bytes to *total (host memory; pinned, for the copy not to block), without synchronizing:
  /// after a synchronization, its section is delta_varint::data_at(k) + *total. For planning
  /// many sections with one synchronization (comm::sparse_sync's parts); encode then takes the
  /// same ws.
  static void queue_delta_measure(cuda& exec, const std::uint64_t* idx, std::uint64_t k, std::uint64_t n,
                                  std::byte* ws, std::uint64_t* total) {
    const std::uint64_t chunks = encode::delta_varint::chunks(k);
    auto* sizes = reinterpret_cast<std::uint64_t*>(ws);
    std::uint64_t* offsets = sizes + chunks + 1;
    launch_over<index_encode_policy>(exec, chunks + 1, delta_sizes_kernel<>, idx, k,
                                     encode::delta_varint::gap_width(n), chunks, sizes);
    void* temp = reinterpret_cast<std::byte*>(offsets + chunks + 1) + 256;
    std::size_t temp_bytes = exclusive_sum_bytes(exec, chunks + 1);
    GRADZIP_CUDA_TRY(cub::DeviceScan::ExclusiveSum(temp, temp_bytes, sizes, offsets, chunks + 1, exec.stream()));
    // offsets[chunks]: every chunk's data
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(total, offsets + chunks, sizeof *total, cudaMemcpyDeviceToHost, exec.stream()));
  }

 private:

  /// delta-varint's section size; chunk c's data offset is left at ws[chunks + 1 + c].
  static std::uint64_t measure_delta(cuda& exec, const std::uint64_t* idx, std::uint64_t k,
                                     std::uint64_t n, std::byte* ws) {
    std::uint64_t total = 0;
    queue_delta_measure(exec, idx, k, n, ws, &total);
    exec.synchronize();  // the payload's layout depends on the size
    return encode::delta_varint::data_at(k) + total;
  }
};

}  // namespace gradzip::detail

/**
 * @file cub.hpp
 * @brief The CUB algorithms gradzip calls, re-implemented for the SIMT backend to CUB's
 * documented contract (tests/simt/include/cub/... forward here, ahead of the real CUB).
 *
 * Block-wide (BlockScan, BlockReduce): a collective every thread of the block must reach, with
 * a block size checked against the template parameters, CUB's TempStorage rule enforced (a
 * __syncthreads() between two uses of one storage), and BlockReduce's result defined in thread
 * 0 only (the others receive poison).
 *
 * Device-wide (DeviceScan, DeviceRadixSort): the two-phase temp-storage protocol (a null
 * pointer asks for the size, which depends only on what CUB's depends on: the item count and
 * the types), cudaErrorInvalidValue for too little storage, for ranges outside device memory
 * or ranges that overlap, and the work enqueued on the stream (so it runs in stream order).
 * The temp storage is poisoned when the work runs: nothing may be kept there across calls.
 */
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace gradzip_simt {

/// Enqueues host-executed device work (a device-wide algorithm) on a stream.
cudaError_t enqueue_work(cudaStream_t stream, std::function<void()> work);
/// Reports a broken contract on stderr and returns `e` (cudaGetLastError returns it too).
cudaError_t report(cudaError_t e, const std::string& message);
/// Whether [p, p + bytes) lies inside one live device allocation.
bool device_range(const void* p, std::size_t bytes);

namespace cub_detail {

template <class T>
void poison(T& v) {
  std::memset(static_cast<void*>(&v), poison_byte, sizeof(T));
}

/// The storage size of a device-wide algorithm, rounded like CUB's allocations.
inline std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

/// A raw pointer's byte range, or an empty range for a fancy iterator (which cannot be checked).
struct byte_range {
  const void* begin = nullptr;
  std::size_t bytes = 0;
  const char* what = "";
};
template <class It>
byte_range range_of(It it, std::size_t n, const char* what) {
  if constexpr (std::is_pointer_v<It>) {
    return {static_cast<const void*>(it), n * sizeof(*it), what};
  } else {
    return {nullptr, 0, what};
  }
}

/// Checks the temp storage's size and that every raw range is device memory and disjoint.
inline cudaError_t check_call(const char* call, const void* temp, std::size_t given, std::size_t needed,
                              std::initializer_list<byte_range> ranges, bool in_place_ok) {
  if (given < needed) {
    return report(cudaErrorInvalidValue, std::string(call) + ": temp_storage_bytes is " + std::to_string(given) +
                                             ", the call needs " + std::to_string(needed));
  }
  std::vector<byte_range> all(ranges);
  all.push_back({temp, needed, "temp storage"});
  for (const byte_range& r : all) {
    if (r.begin != nullptr && r.bytes != 0 && !device_range(r.begin, r.bytes)) {
      return report(cudaErrorInvalidValue, std::string(call) + ": the " + r.what + " is not device memory");
    }
  }
  for (std::size_t i = 0; i < all.size(); ++i) {
    for (std::size_t j = i + 1; j < all.size(); ++j) {
      const byte_range &a = all[i], &b = all[j];
      if (a.begin == nullptr || b.begin == nullptr || a.bytes == 0 || b.bytes == 0) continue;
      if (in_place_ok && a.begin == b.begin && i + 1 == j && j < all.size() - 1) continue;  // d_in == d_out
      const auto* pa = static_cast<const unsigned char*>(a.begin);
      const auto* pb = static_cast<const unsigned char*>(b.begin);
      if (pa < pb + b.bytes && pb < pa + a.bytes) {
        return report(cudaErrorInvalidValue,
                      std::string(call) + ": the " + a.what + " overlaps the " + b.what + " (CUB forbids it)");
      }
    }
  }
  return cudaSuccess;
}

}  // namespace cub_detail
}  // namespace gradzip_simt

namespace cub {

struct Sum {
  template <class A, class B>
  auto operator()(const A& a, const B& b) const {
    return a + b;
  }
};

enum BlockScanAlgorithm { BLOCK_SCAN_RAKING, BLOCK_SCAN_RAKING_MEMOIZE, BLOCK_SCAN_WARP_SCANS };
enum BlockReduceAlgorithm { BLOCK_REDUCE_RAKING_COMMUTATIVE_ONLY, BLOCK_REDUCE_RAKING, BLOCK_REDUCE_WARP_REDUCTIONS };

template <class T, int BLOCK_DIM_X, BlockScanAlgorithm ALGORITHM = BLOCK_SCAN_RAKING, int BLOCK_DIM_Y = 1,
          int BLOCK_DIM_Z = 1>
class BlockScan {
  static constexpr unsigned block_threads = BLOCK_DIM_X * BLOCK_DIM_Y * BLOCK_DIM_Z;

 public:
  /// Sized like CUB's warp-scans storage (an aggregate per warp); only its address is used.
  struct TempStorage {
    alignas(T) unsigned char bytes[sizeof(T) * (block_threads / 32 + 2)];
  };

  explicit BlockScan(TempStorage& storage) : storage_(&storage) {}

  void ExclusiveSum(T input, T& output, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    T aggregate;
    scan(input, output, aggregate, T{}, ::cub::Sum{}, true, "cub::BlockScan::ExclusiveSum", file, line);
  }
  void ExclusiveSum(T input, T& output, T& block_aggregate, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
    scan(input, output, block_aggregate, T{}, ::cub::Sum{}, true, "cub::BlockScan::ExclusiveSum", file, line);
  }
  void InclusiveSum(T input, T& output, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    T aggregate;
    scan(input, output, aggregate, T{}, ::cub::Sum{}, false, "cub::BlockScan::InclusiveSum", file, line);
  }
  void InclusiveSum(T input, T& output, T& block_aggregate, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
    scan(input, output, block_aggregate, T{}, ::cub::Sum{}, false, "cub::BlockScan::InclusiveSum", file, line);
  }
  template <class Op>
  void ExclusiveScan(T input, T& output, T initial, Op op, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    T aggregate;
    scan(input, output, aggregate, initial, op, true, "cub::BlockScan::ExclusiveScan", file, line);
  }
  template <class Op>
  void ExclusiveScan(T input, T& output, T initial, Op op, T& block_aggregate, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    scan(input, output, block_aggregate, initial, op, true, "cub::BlockScan::ExclusiveScan", file, line);
  }

 private:
  template <class Op>
  struct job {
    Op op;
    T initial;
    bool exclusive;
  };
  struct result {
    T output;
    T aggregate;
  };

  /// Every thread's prefix, in thread order: the serial definition of the scan.
  template <class Op>
  static void run(void* const* inputs, void* const* outputs, unsigned threads, const void* extra) {
    const auto& j = *static_cast<const job<Op>*>(extra);
    T running = j.initial;
    T aggregate{};
    for (unsigned t = 0; t < threads; ++t) {
      const T in = *static_cast<const T*>(inputs[t]);
      auto& out = *static_cast<result*>(outputs[t]);
      if (j.exclusive) {
        out.output = running;
        running = j.op(running, in);
      } else {
        running = t == 0 ? in : j.op(running, in);
        out.output = running;
      }
      aggregate = t == 0 ? in : j.op(aggregate, in);
    }
    for (unsigned t = 0; t < threads; ++t) static_cast<result*>(outputs[t])->aggregate = aggregate;
  }

  template <class Op>
  void scan(T input, T& output, T& block_aggregate, T initial, Op op, bool exclusive, const char* name,
            const char* file, int line) {
    const job<Op> j{op, initial, exclusive};
    result r;
    ::gradzip_simt::block_collective({storage_, name, block_threads, &run<Op>, &j, &input, &r}, file, line);
    output = r.output;
    block_aggregate = r.aggregate;
  }

  TempStorage* storage_;
};

template <class T, int BLOCK_DIM_X, BlockReduceAlgorithm ALGORITHM = BLOCK_REDUCE_WARP_REDUCTIONS,
          int BLOCK_DIM_Y = 1, int BLOCK_DIM_Z = 1>
class BlockReduce {
  static constexpr unsigned block_threads = BLOCK_DIM_X * BLOCK_DIM_Y * BLOCK_DIM_Z;

 public:
  struct TempStorage {
    alignas(T) unsigned char bytes[sizeof(T) * (block_threads / 32 + 1)];
  };

  explicit BlockReduce(TempStorage& storage) : storage_(&storage) {}

  /// The sum of every thread's input, in thread 0; the other threads receive poison.
  T Sum(T input, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return reduce(input, ::cub::Sum{}, static_cast<int>(block_threads), "cub::BlockReduce::Sum", file, line);
  }
  T Sum(T input, int num_valid, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return reduce(input, ::cub::Sum{}, num_valid, "cub::BlockReduce::Sum", file, line);
  }
  template <class Op>
  T Reduce(T input, Op op, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return reduce(input, op, static_cast<int>(block_threads), "cub::BlockReduce::Reduce", file, line);
  }
  template <class Op>
  T Reduce(T input, Op op, int num_valid, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return reduce(input, op, num_valid, "cub::BlockReduce::Reduce", file, line);
  }

 private:
  template <class Op>
  struct job {
    Op op;
    int valid;
  };

  template <class Op>
  static void run(void* const* inputs, void* const* outputs, unsigned threads, const void* extra) {
    const auto& j = *static_cast<const job<Op>*>(extra);
    const unsigned valid = std::min<unsigned>(threads, static_cast<unsigned>(std::max(j.valid, 1)));
    T total = *static_cast<const T*>(inputs[0]);
    for (unsigned t = 1; t < valid; ++t) total = j.op(total, *static_cast<const T*>(inputs[t]));
    *static_cast<T*>(outputs[0]) = total;
    for (unsigned t = 1; t < threads; ++t) ::gradzip_simt::cub_detail::poison(*static_cast<T*>(outputs[t]));
  }

  template <class Op>
  T reduce(T input, Op op, int valid, const char* name, const char* file, int line) {
    const job<Op> j{op, valid};
    T out;
    ::gradzip_simt::block_collective({storage_, name, block_threads, &run<Op>, &j, &input, &out}, file, line);
    return out;
  }

  TempStorage* storage_;
};

struct DeviceScan {
  template <class InputIt, class OutputIt, class NumItemsT>
  static cudaError_t ExclusiveSum(void* d_temp_storage, std::size_t& temp_storage_bytes, InputIt d_in, OutputIt d_out,
                                  NumItemsT num_items, cudaStream_t stream = 0) {
    using value_t = typename std::iterator_traits<InputIt>::value_type;
    return scan(d_temp_storage, temp_storage_bytes, d_in, d_out, ::cub::Sum{}, value_t{}, true, num_items, stream,
                "cub::DeviceScan::ExclusiveSum");
  }
  template <class InputIt, class OutputIt, class NumItemsT>
  static cudaError_t InclusiveSum(void* d_temp_storage, std::size_t& temp_storage_bytes, InputIt d_in, OutputIt d_out,
                                  NumItemsT num_items, cudaStream_t stream = 0) {
    using value_t = typename std::iterator_traits<InputIt>::value_type;
    return scan(d_temp_storage, temp_storage_bytes, d_in, d_out, ::cub::Sum{}, value_t{}, false, num_items, stream,
                "cub::DeviceScan::InclusiveSum");
  }
  template <class InputIt, class OutputIt, class ScanOp, class NumItemsT>
  static cudaError_t InclusiveScan(void* d_temp_storage, std::size_t& temp_storage_bytes, InputIt d_in, OutputIt d_out,
                                   ScanOp op, NumItemsT num_items, cudaStream_t stream = 0) {
    using value_t = typename std::iterator_traits<InputIt>::value_type;
    return scan(d_temp_storage, temp_storage_bytes, d_in, d_out, op, value_t{}, false, num_items, stream,
                "cub::DeviceScan::InclusiveScan");
  }
  template <class InputIt, class OutputIt, class ScanOp, class InitT, class NumItemsT>
  static cudaError_t ExclusiveScan(void* d_temp_storage, std::size_t& temp_storage_bytes, InputIt d_in, OutputIt d_out,
                                   ScanOp op, InitT init, NumItemsT num_items, cudaStream_t stream = 0) {
    return scan(d_temp_storage, temp_storage_bytes, d_in, d_out, op, init, true, num_items, stream,
                "cub::DeviceScan::ExclusiveScan");
  }

 private:
  /// CUB's decoupled look-back scan keeps a (status, value) pair per tile of items.
  template <class Accum>
  static std::size_t storage_bytes(std::uint64_t items) {
    const std::uint64_t tiles = (items + 2047) / 2048;
    return ::gradzip_simt::cub_detail::round_up((tiles + 32) * 2 * sizeof(Accum));
  }

  template <class InputIt, class OutputIt, class ScanOp, class InitT, class NumItemsT>
  static cudaError_t scan(void* d_temp_storage, std::size_t& temp_storage_bytes, InputIt d_in, OutputIt d_out, ScanOp op,
                          InitT init, bool exclusive, NumItemsT num_items, cudaStream_t stream, const char* name) {
    namespace d = ::gradzip_simt::cub_detail;
    using accum_t = std::decay_t<decltype(op(init, *d_in))>;
    const auto n = static_cast<std::uint64_t>(num_items);
    const std::size_t needed = storage_bytes<accum_t>(n);
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = needed;
      return cudaSuccess;
    }
    if (const cudaError_t e = d::check_call(name, d_temp_storage, temp_storage_bytes, needed,
                                            {d::range_of(d_in, n, "input"), d::range_of(d_out, n, "output")}, true);
        e != cudaSuccess) {
      return e;
    }
    return ::gradzip_simt::enqueue_work(stream, [=] {
      std::memset(d_temp_storage, ::gradzip_simt::poison_byte, needed);
      accum_t running = static_cast<accum_t>(init);
      for (std::uint64_t i = 0; i < n; ++i) {
        const accum_t in = static_cast<accum_t>(d_in[i]);  // read before the write: in place works
        if (exclusive) {
          d_out[i] = running;
          running = static_cast<accum_t>(op(running, in));
        } else {
          running = i == 0 ? in : static_cast<accum_t>(op(running, in));
          d_out[i] = running;
        }
      }
      std::memset(d_temp_storage, ::gradzip_simt::poison_byte, needed);
    });
  }
};

struct DeviceRadixSort {
  template <class KeyT, class ValueT, class NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, std::size_t& temp_storage_bytes, const KeyT* d_keys_in,
                               KeyT* d_keys_out, const ValueT* d_values_in, ValueT* d_values_out, NumItemsT num_items,
                               int begin_bit = 0, int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0) {
    return sort(d_temp_storage, temp_storage_bytes, d_keys_in, d_keys_out, d_values_in, d_values_out, num_items,
                begin_bit, end_bit, stream, false, "cub::DeviceRadixSort::SortPairs");
  }
  template <class KeyT, class ValueT, class NumItemsT>
  static cudaError_t SortPairsDescending(void* d_temp_storage, std::size_t& temp_storage_bytes, const KeyT* d_keys_in,
                                         KeyT* d_keys_out, const ValueT* d_values_in, ValueT* d_values_out,
                                         NumItemsT num_items, int begin_bit = 0, int end_bit = sizeof(KeyT) * 8,
                                         cudaStream_t stream = 0) {
    return sort(d_temp_storage, temp_storage_bytes, d_keys_in, d_keys_out, d_values_in, d_values_out, num_items,
                begin_bit, end_bit, stream, true, "cub::DeviceRadixSort::SortPairsDescending");
  }
  template <class KeyT, class NumItemsT>
  static cudaError_t SortKeys(void* d_temp_storage, std::size_t& temp_storage_bytes, const KeyT* d_keys_in,
                              KeyT* d_keys_out, NumItemsT num_items, int begin_bit = 0, int end_bit = sizeof(KeyT) * 8,
                              cudaStream_t stream = 0) {
    return sort(d_temp_storage, temp_storage_bytes, d_keys_in, d_keys_out, static_cast<const no_value*>(nullptr),
                static_cast<no_value*>(nullptr), num_items, begin_bit, end_bit, stream, false,
                "cub::DeviceRadixSort::SortKeys");
  }
  template <class KeyT, class NumItemsT>
  static cudaError_t SortKeysDescending(void* d_temp_storage, std::size_t& temp_storage_bytes, const KeyT* d_keys_in,
                                        KeyT* d_keys_out, NumItemsT num_items, int begin_bit = 0,
                                        int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0) {
    return sort(d_temp_storage, temp_storage_bytes, d_keys_in, d_keys_out, static_cast<const no_value*>(nullptr),
                static_cast<no_value*>(nullptr), num_items, begin_bit, end_bit, stream, true,
                "cub::DeviceRadixSort::SortKeysDescending");
  }

 private:
  struct no_value {};

  /// CUB's single-buffer sorts keep alternate key and value buffers plus digit histograms.
  template <class KeyT, class ValueT>
  static std::size_t storage_bytes(std::uint64_t items) {
    namespace d = ::gradzip_simt::cub_detail;
    const std::size_t values = std::is_same_v<ValueT, no_value> ? 0 : d::round_up(items * sizeof(ValueT));
    return d::round_up(items * sizeof(KeyT)) + values + 8192;
  }

  template <class KeyT, class ValueT, class NumItemsT>
  static cudaError_t sort(void* d_temp_storage, std::size_t& temp_storage_bytes, const KeyT* keys_in, KeyT* keys_out,
                          const ValueT* values_in, ValueT* values_out, NumItemsT num_items, int begin_bit,
                          int end_bit, cudaStream_t stream, bool descending, const char* name) {
    namespace d = ::gradzip_simt::cub_detail;
    static_assert(std::is_integral_v<KeyT> && std::is_unsigned_v<KeyT>,
                  "the SIMT DeviceRadixSort sorts unsigned integer keys (add CUB's bit twiddling for others)");
    const auto n = static_cast<std::uint64_t>(num_items);
    const std::size_t needed = storage_bytes<KeyT, ValueT>(n);
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = needed;
      return cudaSuccess;
    }
    if (begin_bit < 0 || end_bit > static_cast<int>(sizeof(KeyT) * 8) || begin_bit >= end_bit) {
      return ::gradzip_simt::report(cudaErrorInvalidValue, std::string(name) + ": bits [" + std::to_string(begin_bit) +
                                                               ", " + std::to_string(end_bit) + ") are not a range of the key");
    }
    constexpr bool pairs = !std::is_same_v<ValueT, no_value>;
    const std::uint64_t value_items = pairs ? n : 0;
    if (const cudaError_t e = d::check_call(
            name, d_temp_storage, temp_storage_bytes, needed,
            {d::range_of(keys_in, n, "keys input"), d::range_of(keys_out, n, "keys output"),
             d::range_of(values_in, value_items, "values input"), d::range_of(values_out, value_items, "values output")},
            false);
        e != cudaSuccess) {
      return e;
    }
    return ::gradzip_simt::enqueue_work(stream, [=] {
      std::memset(d_temp_storage, ::gradzip_simt::poison_byte, needed);
      const int width = end_bit - begin_bit;
      const KeyT mask = width >= static_cast<int>(sizeof(KeyT) * 8) ? static_cast<KeyT>(~KeyT{0})
                                                                     : static_cast<KeyT>((KeyT{1} << width) - 1);
      auto digit = [&](KeyT k) { return static_cast<KeyT>((k >> begin_bit) & mask); };
      std::vector<std::uint64_t> order(n);
      std::iota(order.begin(), order.end(), std::uint64_t{0});
      // LSD radix sorting is stable: equal digits keep their input order, both directions.
      std::stable_sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) {
        return descending ? digit(keys_in[a]) > digit(keys_in[b]) : digit(keys_in[a]) < digit(keys_in[b]);
      });
      for (std::uint64_t i = 0; i < n; ++i) keys_out[i] = keys_in[order[i]];
      if constexpr (pairs) {
        for (std::uint64_t i = 0; i < n; ++i) values_out[i] = values_in[order[i]];
      }
      std::memset(d_temp_storage, ::gradzip_simt::poison_byte, needed);
    });
  }
};

}  // namespace cub

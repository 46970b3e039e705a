// zen_engine<cuda>: comm::sparse_sync's steps on the GPU, with the host engine's bytes and sums
// (detail/host/sparse_sync.hpp has the same operations over std::vector).
//
// - split: each nonzero's part, a stable radix sort by part (equal parts stay in index order),
//   per-part counts (in shared memory per block, then one global atomic per part and block),
//   then a gather of (position in I_p, value) in part order.
// - encode: the frame by a one-thread kernel (zen_part::write_frame, the host's function), the
//   positions by index_encoder<cuda> (the host's encodings, byte for byte), the values copied.
// - check_all: every payload's frame (header and params) is read to the host at once and
//   checked there; then every payload's positions are expanded on the device into a u64 array,
//   checked as they go (COO: below |I_p| and increasing; bitmap: no bit past the end, the count;
//   delta-varint: each chunk's own checks), one flag per payload, read back at once. When
//   anything fails, the whole payload is read back and the host's check names the failure, so
//   both executors report the same message.
// - sum: one kernel per part in rank order, each adding its values into a dense sum over the
//   universe (positions within a part are distinct, so no two threads meet): the host's order.
// - compact: a scan of the touched flags, then a scatter of (position, sum).
// - merge (Hierarchical Centralization): the lower rank's entries are written into a dense sum
//   over [0, n), then the higher rank's added, then compacted: O(n) per stage, where the host
//   merges two sorted lists in O(k).
// Every call that returns a count to the host synchronizes the stream (sizes go into the
// collectives' size exchanges).
#pragma once

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <utility>
#include <vector>

#include "gradzip/comm/sparse_sync.hpp"

namespace gradzip::detail {

/// Zen's sparse synchronization: one entry (or bitmap word, delta chunk, universe element) per
/// thread and grid-stride step.
using sparse_sync_policy = launch_policy<256, 1, 8>;

namespace zen_device {

using comm::detail::add_scaled;

#define GRADZIP_ZEN_LOOP(j, count)                                                                 \
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < (count); \
       j += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)

/// The lowest j whose index breaks the caller's promise (increasing, below n).
template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void check_indices_kernel(const std::uint64_t* indices, std::uint64_t m, std::uint64_t n, unsigned long long* lowest) {
  GRADZIP_ZEN_LOOP(j, m) {
    if (indices[j] >= n || (j > 0 && indices[j] <= indices[j - 1])) atomicMin(lowest, static_cast<unsigned long long>(j));
  }
}

/// Parts up to this many are counted in shared memory first (16 KiB), so that the global
/// counters see one atomic per part and block, not one per nonzero (P counters would serialize
/// every nonzero's atomic).
inline constexpr std::uint32_t shared_part_counts = 4096;

/// Each nonzero's part (the sort key), its place in the input (the sorted value), and the
/// parts' counts.
template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void parts_kernel(const std::uint64_t* indices, std::uint64_t m, std::uint64_t seed, std::uint32_t parts,
                  std::uint32_t* part, std::uint32_t* place, unsigned long long* counts) {
  __shared__ unsigned local[shared_part_counts];
  const bool in_shared = parts <= shared_part_counts;
  if (in_shared) {
    for (std::uint32_t p = threadIdx.x; p < parts; p += blockDim.x) local[p] = 0;
    __syncthreads();
  }
  GRADZIP_ZEN_LOOP(j, m) {
    const std::uint32_t p = hash::partition::part_of(seed, indices[j], parts);
    part[j] = p;
    place[j] = static_cast<std::uint32_t>(j);
    if (in_shared) {
      atomicAdd(local + p, 1u);
    } else {
      atomicAdd(counts + p, 1ull);
    }
  }
  if (in_shared) {
    __syncthreads();
    for (std::uint32_t p = threadIdx.x; p < parts; p += blockDim.x) {
      if (local[p] != 0) atomicAdd(counts + p, static_cast<unsigned long long>(local[p]));
    }
  }
}

/// Sorted entry s: its position in its part's member space, and its value.
template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void gather_split_kernel(const std::uint64_t* indices, const float* values, const std::uint32_t* sorted_place,
                         std::uint64_t m, const std::uint32_t* member_position, std::uint64_t* positions,
                         float* out_values) {
  GRADZIP_ZEN_LOOP(s, m) {
    const std::uint32_t j = sorted_place[s];
    positions[s] = member_position[indices[j]];
    out_values[s] = values[j];
  }
}

template <class = void>
__global__ __launch_bounds__(1)
void write_frame_kernel(std::uint8_t* out, comm::detail::zen_part z) {
  z.write_frame(out);  // the host's function: the same bytes
}

template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void coo_positions_kernel(const std::uint8_t* section, int width, std::uint64_t k, std::uint64_t members,
                          std::uint64_t* positions, unsigned* bad) {
  GRADZIP_ZEN_LOOP(j, k) {
    const std::uint64_t i = encode::coo::load(section, width, j);
    if (i >= members || (j > 0 && i <= encode::coo::load(section, width, j - 1))) atomicOr(bad, 1u);
    positions[j] = i;
  }
}

template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void bitmap_counts_kernel(const std::uint8_t* section, std::uint64_t members, std::uint64_t words,
                          std::uint64_t* counts, unsigned* bad) {
  GRADZIP_ZEN_LOOP(w, words) {
    std::uint64_t bits = 0;
    if (!encode::bitmap::count_bits(section, members, w, w + 1, bits).ok()) atomicOr(bad, 1u);
    counts[w] = bits;
  }
}

/// Word w's set bits become entries first[w] ... in order; the last word checks the total.
template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void bitmap_positions_kernel(const std::uint8_t* section, std::uint64_t words, const std::uint64_t* counts,
                             const std::uint64_t* first, std::uint64_t k, std::uint64_t* positions, unsigned* bad) {
  GRADZIP_ZEN_LOOP(w, words) {
    if (w + 1 == words && first[w] + counts[w] != k) atomicOr(bad, 1u);
    encode::bitmap::for_each_index(section, w, w + 1, first[w], [&](std::uint64_t j, std::uint64_t i) {
      if (j < k) positions[j] = i;
    });
  }
}

template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void delta_positions_kernel(const std::uint8_t* section, std::uint64_t size, std::uint64_t k, std::uint64_t members,
                            int width, std::uint64_t chunks, std::uint64_t* positions, unsigned* bad) {
  GRADZIP_ZEN_LOOP(c, chunks) {
    const wire::status s = encode::delta_varint::decode_chunk(section, size, k, members, width, c,
                                                              [&](std::uint64_t j, std::uint64_t i) {
                                                                if (j < k) positions[j] = i;
                                                              });
    if (!s.ok()) atomicOr(bad, 1u);
  }
}

/// sums[p] += v, touched[p] = 1 for a validated part's entries (distinct positions).
template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void sum_kernel(const std::uint64_t* positions, const float* values, std::uint64_t k, float* sums,
                std::uint32_t* touched) {
  GRADZIP_ZEN_LOOP(j, k) {
    sums[positions[j]] += values[j];
    touched[positions[j]] = 1;
  }
}

/// The merge's operands: the first sets, the second adds where the first was (so a value alone
/// keeps its bits, -0 included, and a shared one is first + second).
template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void merge_kernel(const std::uint64_t* positions, const float* values, std::uint64_t k, bool second, float* sums,
                  std::uint32_t* touched) {
  GRADZIP_ZEN_LOOP(j, k) {
    const std::uint64_t p = positions[j];
    sums[p] = second && touched[p] != 0 ? sums[p] + values[j] : values[j];
    touched[p] = 1;
  }
}

template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void compact_kernel(const float* sums, const std::uint32_t* touched, const std::uint32_t* at, std::uint64_t universe,
                    std::uint64_t* positions, float* values) {
  GRADZIP_ZEN_LOOP(i, universe) {
    if (touched[i] != 0) {
      positions[at[i]] = i;
      values[at[i]] = sums[i];
    }
  }
}

/// out[i] += alpha sums[i] where touched; counts them.
template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void apply_sums_kernel(const float* sums, const std::uint32_t* touched, std::uint64_t n, float* out, float alpha,
                       unsigned long long* count) {
  unsigned long long mine = 0;
  GRADZIP_ZEN_LOOP(i, n) {
    if (touched[i] != 0) {
      add_scaled(out[i], sums[i], alpha);
      ++mine;
    }
  }
  if (mine != 0) atomicAdd(count, mine);
}

/// out[where(position)] += alpha value; `members` maps a part's positions to indices (null:
/// positions are indices).
template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void apply_entries_kernel(const std::uint64_t* positions, const float* values, std::uint64_t k,
                          const std::uint64_t* members, float* out, float alpha) {
  GRADZIP_ZEN_LOOP(j, k) {
    const std::uint64_t i = members != nullptr ? members[positions[j]] : positions[j];
    add_scaled(out[i], values[j], alpha);
  }
}

template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void nonzero_flags_kernel(const float* dense, std::uint64_t n, std::uint32_t* flags) {
  GRADZIP_ZEN_LOOP(i, n) { flags[i] = dense[i] != 0.0f ? 1u : 0u; }
}

template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void scatter_kernel(const std::uint64_t* indices, const float* values, std::uint64_t m, float* dense) {
  GRADZIP_ZEN_LOOP(j, m) { dense[indices[j]] = values[j]; }
}

template <class = void>
__global__ __launch_bounds__(sparse_sync_policy::threads)
void add_dense_kernel(const float* dense, std::uint64_t n, float* out, float alpha) {
  GRADZIP_ZEN_LOOP(i, n) { add_scaled(out[i], dense[i], alpha); }
}

#undef GRADZIP_ZEN_LOOP

/// A device array with a size and a capacity; growing keeps the contents (stream-ordered copy).
template <class T>
class growable {
 public:
  std::size_t size() const noexcept { return size_; }
  T* data() const noexcept { return storage_.data(); }

  void resize(cuda& exec, std::size_t size) {
    if (size > storage_.size()) {
      device_buffer<T> bigger(std::max(size, storage_.size() + storage_.size() / 2));
      if (size_ != 0) {
        GRADZIP_CUDA_TRY(cudaMemcpyAsync(bigger.data(), storage_.data(), size_ * sizeof(T), cudaMemcpyDeviceToDevice,
                                         exec.stream()));
        exec.synchronize();  // the copy is done before the old block goes (cudaFree would wait too)
      }
      storage_ = std::move(bigger);
    }
    size_ = size;
  }

 private:
  device_buffer<T> storage_;
  std::size_t size_ = 0;
};

/// Page-locked host bytes (cudaMallocHost), grown as needed, contents not kept: copies into them
/// are asynchronous.
class pinned_bytes {
 public:
  pinned_bytes() = default;
  pinned_bytes(const pinned_bytes&) = delete;
  pinned_bytes& operator=(const pinned_bytes&) = delete;
  pinned_bytes(pinned_bytes&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  pinned_bytes& operator=(pinned_bytes&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~pinned_bytes() {
    if (data_ != nullptr) GRADZIP_CUDA_TRY_NO_THROW(cudaFreeHost(data_));
  }
  /// At least `size` bytes (the old ones are freed: call between uses, never during a copy).
  void reserve(std::size_t size) {
    if (size <= size_) return;
    if (data_ != nullptr) GRADZIP_CUDA_TRY(cudaFreeHost(data_));
    data_ = nullptr;
    size_ = 0;
    GRADZIP_CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&data_), size));
    size_ = size;
  }
  std::uint8_t* data() const noexcept { return data_; }

 private:
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

template <class T>
void download(cuda& exec, T* to, const T* from, std::size_t count) {
  if (count == 0) return;
  GRADZIP_CUDA_TRY(cudaMemcpyAsync(to, from, count * sizeof(T), cudaMemcpyDeviceToHost, exec.stream()));
  exec.synchronize();
}

}  // namespace zen_device
}  // namespace gradzip::detail

namespace gradzip::comm::detail {

template <>
struct zen_engine<cuda> {
  template <class T>
  using growable = gradzip::detail::zen_device::growable<T>;
  using policy = gradzip::detail::sparse_sync_policy;
  using bytes = growable<std::byte>;

  /// Entries in device memory: positions (increasing) and their values.
  struct list {
    growable<std::uint64_t> positions;
    growable<float> values;
    std::uint64_t size() const noexcept { return positions.size(); }
    const std::uint64_t* position_data(std::uint64_t at = 0) const { return positions.data() + at; }
    const float* value_data(std::uint64_t at = 0) const { return values.data() + at; }
    void resize(cuda& exec, std::uint64_t k) {
      positions.resize(exec, k);
      values.resize(exec, k);
    }
  };

  /// A validated payload: its frame, its positions expanded, its values in place.
  struct view {
    zen_part frame;
    growable<std::uint64_t> positions;
    const float* values = nullptr;
  };

  /// Uploads the member tables (12 bytes per index).
  explicit zen_engine(const zen_tables& t)
      : position_(t.position.size()), members_(t.members.size()), seed_(t.partition.seed()),
        parts_(t.partition.parts()), start_(t.start) {
    upload(position_.data(), t.position);
    upload(members_.data(), t.members);
    // A copy from pageable memory may return before its DMA lands, and the executor's stream
    // (non-blocking, perhaps) does not wait for the legacy stream: finish it here, once.
    GRADZIP_CUDA_TRY(cudaDeviceSynchronize());
  }

  /// The largest universe this engine sums over: its touched flags' offsets are 32-bit.
  static constexpr std::uint64_t max_universe = 0xFFFFFFFFull;

  static std::byte* data(bytes& b) { return b.data(); }
  static void resize(cuda& exec, bytes& b, std::uint64_t size) { b.resize(exec, static_cast<std::size_t>(size)); }

  /// Before a collective on device buffers: a communicator with a stream (NCCL) waits for this
  /// executor's work by an event; one that completes its collectives before returning (a
  /// CUDA-aware MPI) reads the buffers at once, so the stream is drained first.
  static void hand_over(cuda& exec, communicator& comm) {
    void* stream = comm.cuda_stream();
    if (stream == nullptr) {
      exec.synchronize();
    } else if (stream != exec.stream()) {
      exec.order_before(static_cast<cudaStream_t>(stream));
    }
  }
  /// After it: this executor's later work waits for the communicator's stream.
  static void take_back(cuda& exec, communicator& comm) {
    void* stream = comm.cuda_stream();
    if (stream != nullptr && stream != exec.stream()) exec.order_after(static_cast<cudaStream_t>(stream));
  }

  static void check_indices(cuda& exec, span<const std::uint64_t> indices, std::uint64_t n, const char* what) {
    if (indices.empty()) return;
    auto* lowest = reinterpret_cast<unsigned long long*>(exec.scratch(256));
    GRADZIP_CUDA_TRY(cudaMemsetAsync(lowest, 0xFF, sizeof *lowest, exec.stream()));
    gradzip::detail::launch_over<policy>(exec, indices.size(), gradzip::detail::zen_device::check_indices_kernel<>,
                                         indices.data(), static_cast<std::uint64_t>(indices.size()), n, lowest);
    unsigned long long j = 0;
    gradzip::detail::zen_device::download(exec, &j, lowest, 1);
    if (j == ~0ull) return;
    std::uint64_t index = 0;
    gradzip::detail::zen_device::download(exec, &index, indices.data() + j, 1);
    GRADZIP_EXPECTS(false, what, ": index ", j, " (", index, ") is not increasing and below n = ", n);
  }

  static void assign(cuda& exec, list& to, span<const std::uint64_t> indices, span<const float> values) {
    to.resize(exec, indices.size());
    copy(exec, to.positions.data(), indices.data(), indices.size());
    copy(exec, to.values.data(), values.data(), values.size());
  }

  /// Step 1: the entries by part, each part's as positions in I_p (increasing), at
  /// to[first[p] .. first[p + 1]).
  void split(cuda& exec, const zen_tables&, span<const std::uint64_t> indices, span<const float> values, list& to,
             std::vector<std::uint64_t>& first) {
    using namespace gradzip::detail;
    const std::uint64_t m = indices.size();
    GRADZIP_EXPECTS(m < (std::uint64_t{1} << 32), "sparse_sync (cuda): at most 2^32 - 1 nonzeros, got ", m);
    std::size_t sort_bytes = 0;
    GRADZIP_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const std::uint32_t*>(nullptr),
                                                     static_cast<std::uint32_t*>(nullptr),
                                                     static_cast<const std::uint32_t*>(nullptr),
                                                     static_cast<std::uint32_t*>(nullptr), m, 0, radix_bits(parts_),
                                                     exec.stream()));
    // Scratch: part, place, sorted part, sorted place (m words each), counts, CUB's.
    const std::size_t words = scratch_aligned(m * 4), at_counts = 4 * words,
                      at_temp = at_counts + scratch_aligned(parts_ * 8);
    std::byte* scratch = exec.scratch(at_temp + scratch_aligned(sort_bytes));
    auto* part = reinterpret_cast<std::uint32_t*>(scratch);
    auto* place = reinterpret_cast<std::uint32_t*>(scratch + words);
    auto* sorted_part = reinterpret_cast<std::uint32_t*>(scratch + 2 * words);
    auto* sorted_place = reinterpret_cast<std::uint32_t*>(scratch + 3 * words);
    auto* counts = reinterpret_cast<unsigned long long*>(scratch + at_counts);
    GRADZIP_CUDA_TRY(cudaMemsetAsync(counts, 0, parts_ * 8, exec.stream()));
    to.resize(exec, m);
    if (m != 0) {
      launch_over<policy>(exec, m, zen_device::parts_kernel<>, indices.data(), m, seed_, parts_, part, place, counts);
      GRADZIP_CUDA_TRY(cub::DeviceRadixSort::SortPairs(scratch + at_temp, sort_bytes, part, sorted_part, place,
                                                       sorted_place, m, 0, radix_bits(parts_), exec.stream()));
      launch_over<policy>(exec, m, zen_device::gather_split_kernel<>, indices.data(), values.data(), sorted_place, m,
                          position_.data(), to.positions.data(), to.values.data());
    }
    first.assign(parts_ + 1, 0);
    zen_device::download(exec, first.data() + 1, reinterpret_cast<const std::uint64_t*>(counts), parts_);
    for (std::uint32_t p = 0; p < parts_; ++p) first[p + 1] += first[p];
  }

  /// Appends the payload of each frame (all but its encoding and index bytes, which this fills)
  /// with frames[p].k entries at l[first[p] ..) to `to`, sizes[p] <- its size: every
  /// delta-varint measurement first, each part in its own workspace, then one synchronization.
  void encode_all(cuda& exec, std::vector<zen_part>& frames, const list& l, const std::vector<std::uint64_t>& first,
                  bytes& to, std::vector<std::uint64_t>& sizes) {
    using encoder = gradzip::detail::index_encoder<cuda>;
    const std::size_t count = frames.size();
    workspace_at_.assign(count + 1, 0);
    for (std::size_t p = 0; p < count; ++p) {
      workspace_at_[p + 1] = workspace_at_[p] + gradzip::detail::scratch_aligned(encoder::workspace_bytes(exec, frames[p].k));
    }
    workspace_.resize(exec, workspace_at_[count]);
    totals_.reserve(count * sizeof(std::uint64_t));
    auto* totals = reinterpret_cast<std::uint64_t*>(totals_.data());
    const auto measured = [&](std::size_t p) {
      return encode::automatic::delta_may_win(frames[p].k, frames[p].members);
    };
    bool any = false;
    for (std::size_t p = 0; p < count; ++p) {
      if (measured(p)) {
        encoder::queue_delta_measure(exec, l.position_data(first[p]), frames[p].k, frames[p].members,
                                     workspace_.data() + workspace_at_[p], totals + p);
        any = true;
      }
    }
    if (any) exec.synchronize();
    sizes.resize(count);
    std::uint64_t bytes_total = 0;
    for (std::size_t p = 0; p < count; ++p) {
      zen_part& z = frames[p];
      const std::uint64_t delta = measured(p) ? encode::delta_varint::data_at(z.k) + totals[p] : 0;
      z.index_bytes = encode::automatic_section(z.k, z.members, delta, z.encoding);
      sizes[p] = z.layout().total_bytes();
      bytes_total += sizes[p];
    }
    std::size_t at = to.size();
    to.resize(exec, at + static_cast<std::size_t>(bytes_total));
    for (std::size_t p = 0; p < count; ++p) {
      const zen_part& z = frames[p];
      const wire::payload_layout layout = z.layout();
      auto* base = reinterpret_cast<std::uint8_t*>(to.data() + at);
      gradzip::detail::launch(gradzip::detail::zen_device::write_frame_kernel<>, 1, 1, 0, exec.stream(), base, z);
      encoder::encode(exec, z.encoding, l.position_data(first[p]), z.k, z.members, workspace_.data() + workspace_at_[p],
                      base + layout.at(1).offset);
      copy(exec, reinterpret_cast<float*>(base + layout.at(2).offset), l.value_data(first[p]), z.k);
      at += static_cast<std::size_t>(sizes[p]);
    }
  }

  /// Checks each payload `expects` names in b: every frame read back at once and checked on
  /// the host, then every payload's positions expanded here (into views[i].positions) and
  /// checked as they are read, the verdicts read back at once: two synchronizations however
  /// many payloads. A payload that fails is read back whole and the host's check names the
  /// failure.
  void check_all(cuda& exec, bytes& b, const std::vector<zen_expect>& expects, std::uint32_t ranks,
                 std::vector<view>& views, std::vector<wire::status>& out) {
    using namespace gradzip::detail;
    const std::size_t count = expects.size();
    views.resize(count);
    out.assign(count, wire::status{});
    const auto* base = reinterpret_cast<const std::uint8_t*>(b.data());
    auto aligned = [&](std::size_t i) {
      return reinterpret_cast<std::uintptr_t>(base + expects[i].at) % wire::alignment == 0;
    };
    auto readable = [&](std::size_t i) { return std::min<std::uint64_t>(expects[i].size, prefix_bytes); };
    // 1. Every frame to the host: into pinned memory, so that the copies queue without blocking
    // and one synchronization waits for all of them.
    prefix_.reserve(count * prefix_bytes);
    for (std::size_t i = 0; i < count; ++i) {
      if (aligned(i) && readable(i) != 0) {
        GRADZIP_CUDA_TRY(cudaMemcpyAsync(prefix_.data() + i * prefix_bytes, base + expects[i].at, readable(i),
                                         cudaMemcpyDeviceToHost, exec.stream()));
      }
    }
    exec.synchronize();
    // 2. The frames, on the host; what the device pass needs.
    pending_.assign(count, 0);
    indices_.assign(count, nullptr);
    word_offset_.assign(count + 1, 0);
    std::size_t scan_bytes = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const zen_expect& e = expects[i];
      const std::uint8_t* frame = prefix_.data() + i * prefix_bytes;
      zen_part_view hv;
      word_offset_[i + 1] = word_offset_[i];
      if (!aligned(i) ||
          !check_zen_frame(frame, e.size, readable(i), e.part, e.sender, e.phase, e.members, ranks, hv).ok()) {
        out[i] = host_verdict(exec, base, e, ranks);
        continue;
      }
      view& v = views[i];
      v.frame = hv.frame;
      v.values = reinterpret_cast<const float*>(base + e.at + (hv.value_bytes - frame));
      v.positions.resize(exec, v.frame.k);
      indices_[i] = base + e.at + (hv.indices - frame);
      if (v.frame.encoding == encode::bitmap::id) {
        const std::uint64_t words = encode::bitmap::words(v.frame.members);
        word_offset_[i + 1] += 2 * words;  // counts, then their exclusive sum
        if (words != 0) scan_bytes = std::max(scan_bytes, exclusive_sum_bytes(exec, words));
      }
      pending_[i] = 1;
    }
    // 3. Every payload's positions, each with its own flag.
    counts_.resize(exec, word_offset_[count]);
    const std::size_t flag_bytes = scratch_aligned(count * sizeof(unsigned));
    std::byte* scratch = exec.scratch(flag_bytes + scan_bytes);
    auto* flags = reinterpret_cast<unsigned*>(scratch);
    if (count != 0) GRADZIP_CUDA_TRY(cudaMemsetAsync(flags, 0, count * sizeof(unsigned), exec.stream()));
    for (std::size_t i = 0; i < count; ++i) {
      if (pending_[i] != 0) {
        expand(exec, indices_[i], views[i], flags + i, counts_.data() + word_offset_[i], scratch + flag_bytes,
               scan_bytes);
      }
    }
    // 4. The verdicts.
    flags_.assign(count, 0);
    zen_device::download(exec, flags_.data(), flags, count);
    for (std::size_t i = 0; i < count; ++i) {
      if (pending_[i] != 0 && flags_[i] != 0) out[i] = host_verdict(exec, base, expects[i], ranks);
    }
  }

  /// sums[i] <- the sum from zero, in view order, of the views' values at i (i below
  /// `universe`), and touched[i] <- whether any of them has i. The views are validated.
  void sum(cuda& exec, const std::vector<view>& views, std::uint64_t universe) {
    clear_sums(exec, universe);
    for (const view& v : views) {
      if (v.frame.k == 0) continue;
      gradzip::detail::launch_over<policy>(exec, v.frame.k, gradzip::detail::zen_device::sum_kernel<>,
                                           v.positions.data(), v.values, v.frame.k, sums_.data(), touched_.data());
    }
  }

  /// `to` <- the touched positions below `universe` and their sums.
  void compact(cuda& exec, std::uint64_t universe, list& to) { compact_from(exec, sums_.data(), universe, to); }

  /// `to` <- the touched positions below `universe` and source's elements there.
  void compact_from(cuda& exec, const float* source, std::uint64_t universe, list& to) {
    using namespace gradzip::detail;
    if (universe == 0) {
      to.resize(exec, 0);
      return;
    }
    // run checks the schemes' universes before any communication; this guards sum_nonzeros'
    // compaction over its dense input.
    GRADZIP_EXPECTS(universe <= max_universe, "sparse_sync (cuda): a universe of ", universe,
                    " indices; this executor sums over at most ", max_universe);
    std::size_t scan_bytes = 0;
    GRADZIP_CUDA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<const std::uint32_t*>(nullptr),
                                                   static_cast<std::uint32_t*>(nullptr), universe, exec.stream()));
    at_.resize(exec, universe);
    std::byte* temp = exec.scratch(scan_bytes);
    GRADZIP_CUDA_TRY(cub::DeviceScan::ExclusiveSum(temp, scan_bytes, touched_.data(), at_.data(), universe,
                                                   exec.stream()));
    std::uint32_t last_at = 0, last_touched = 0;
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(&last_at, at_.data() + universe - 1, 4, cudaMemcpyDeviceToHost, exec.stream()));
    GRADZIP_CUDA_TRY(
        cudaMemcpyAsync(&last_touched, touched_.data() + universe - 1, 4, cudaMemcpyDeviceToHost, exec.stream()));
    exec.synchronize();
    to.resize(exec, static_cast<std::uint64_t>(last_at) + last_touched);
    launch_over<policy>(exec, universe, zen_device::compact_kernel<>, source, touched_.data(), at_.data(), universe,
                        to.positions.data(), to.values.data());
  }

  /// out[i] += alpha sums[i] where touched; returns how many.
  std::uint64_t apply_sums(cuda& exec, span<float> out, float alpha) {
    auto* count = reinterpret_cast<unsigned long long*>(exec.scratch(256));
    GRADZIP_CUDA_TRY(cudaMemsetAsync(count, 0, sizeof *count, exec.stream()));
    if (!out.empty()) {
      gradzip::detail::launch_over<policy>(exec, out.size(), gradzip::detail::zen_device::apply_sums_kernel<>,
                                           sums_.data(), touched_.data(), static_cast<std::uint64_t>(out.size()),
                                           out.data(), alpha, count);
    }
    unsigned long long touched = 0;
    gradzip::detail::zen_device::download(exec, &touched, count, 1);
    return touched;
  }

  /// out[member] += alpha value for every entry of reduced part q (validated), positions in I_q.
  void apply_part(cuda& exec, const zen_tables&, std::uint32_t q, const view& v, span<float> out, float alpha) {
    if (v.frame.k == 0) return;
    gradzip::detail::launch_over<policy>(exec, v.frame.k, gradzip::detail::zen_device::apply_entries_kernel<>,
                                         v.positions.data(), v.values, v.frame.k,
                                         static_cast<const std::uint64_t*>(members_.data() + start_[q]), out.data(),
                                         alpha);
  }

  static void apply_list(cuda& exec, const list& l, span<float> out, float alpha) {
    if (l.size() == 0) return;
    gradzip::detail::launch_over<policy>(exec, l.size(), gradzip::detail::zen_device::apply_entries_kernel<>,
                                         l.position_data(), l.value_data(), l.size(),
                                         static_cast<const std::uint64_t*>(nullptr), out.data(), alpha);
  }

  /// mine <- the union of mine and v's entries (merge), or v's entries alone; where both have a
  /// position, the lower rank's value is the first operand (mine's when `mine_first`).
  void merge(cuda& exec, list& mine, const view& v, bool mine_first, bool merge) {
    using namespace gradzip::detail;
    const std::uint64_t k = v.frame.k;
    if (!merge) {
      mine.resize(exec, k);
      copy(exec, mine.positions.data(), v.positions.data(), k);
      copy(exec, mine.values.data(), v.values, k);
      return;
    }
    const std::uint64_t n = members_.size();
    clear_sums(exec, n);
    auto put = [&](const std::uint64_t* positions, const float* values, std::uint64_t count, bool second) {
      if (count != 0) {
        launch_over<policy>(exec, count, zen_device::merge_kernel<>, positions, values, count, second, sums_.data(),
                            touched_.data());
      }
    };
    if (mine_first) {
      put(mine.position_data(), mine.value_data(), mine.size(), false);
      put(v.positions.data(), v.values, k, true);
    } else {
      put(v.positions.data(), v.values, k, false);
      put(mine.position_data(), mine.value_data(), mine.size(), true);
    }
    compact(exec, n, mine);
  }

  /// `to` <- the positions of dense's nonzero elements, increasing, and the elements.
  void nonzeros(cuda& exec, span<const float> dense, list& to) {
    touched_.resize(exec, dense.size());
    if (!dense.empty()) {
      gradzip::detail::launch_over<policy>(exec, dense.size(), gradzip::detail::zen_device::nonzero_flags_kernel<>,
                                           dense.data(), static_cast<std::uint64_t>(dense.size()), touched_.data());
    }
    compact_from(exec, dense.data(), dense.size(), to);
  }
  static void zero(cuda& exec, span<float> y) {
    if (!y.empty()) GRADZIP_CUDA_TRY(cudaMemsetAsync(y.data(), 0, y.size() * sizeof(float), exec.stream()));
  }
  static void copy(cuda& exec, span<const float> from, span<float> to) { copy(exec, to.data(), from.data(), from.size()); }

  /// The dense baseline's buffer: n zeros, then values[j] at indices[j].
  float* densify(cuda& exec, span<const std::uint64_t> indices, span<const float> values, std::uint64_t n) {
    clear_sums(exec, n);
    if (!indices.empty()) {
      gradzip::detail::launch_over<policy>(exec, indices.size(), gradzip::detail::zen_device::scatter_kernel<>,
                                           indices.data(), values.data(), static_cast<std::uint64_t>(indices.size()),
                                           sums_.data());
    }
    return sums_.data();
  }

  /// out[i] += alpha buffer[i], every i.
  void add_dense(cuda& exec, span<float> out, float alpha) {
    if (out.empty()) return;
    gradzip::detail::launch_over<policy>(exec, out.size(), gradzip::detail::zen_device::add_dense_kernel<>,
                                         static_cast<const float*>(sums_.data()),
                                         static_cast<std::uint64_t>(out.size()), out.data(), alpha);
  }

  /// Host values through a communicator whose collectives take device memory (it has a
  /// stream): staged through a device buffer.
  void allreduce_host(communicator& comm, cuda& exec, double* values, std::size_t count) {
    void* stream = comm.cuda_stream();
    if (stream == nullptr) {
      comm.allreduce_sum(values, count, element_type::f64);
      return;
    }
    staged_.resize(exec, count);
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(staged_.data(), values, count * sizeof(double), cudaMemcpyHostToDevice,
                                     static_cast<cudaStream_t>(stream)));
    comm.allreduce_sum(staged_.data(), count, element_type::f64);
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(values, staged_.data(), count * sizeof(double), cudaMemcpyDeviceToHost,
                                     static_cast<cudaStream_t>(stream)));
    GRADZIP_CUDA_TRY(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  }

 private:
  /// Bytes of a payload read to check its frame: the largest header and the params fit.
  static constexpr std::uint64_t prefix_bytes = 1024;

  template <class T>
  static void upload(T* to, const std::vector<T>& from) {
    if (!from.empty()) GRADZIP_CUDA_TRY(cudaMemcpy(to, from.data(), from.size() * sizeof(T), cudaMemcpyHostToDevice));
  }

  template <class T>
  static void copy(cuda& exec, T* to, const T* from, std::uint64_t count) {
    if (count != 0) {
      GRADZIP_CUDA_TRY(cudaMemcpyAsync(to, from, count * sizeof(T), cudaMemcpyDeviceToDevice, exec.stream()));
    }
  }

  void clear_sums(cuda& exec, std::uint64_t universe) {
    sums_.resize(exec, universe);
    touched_.resize(exec, universe);
    if (universe == 0) return;
    GRADZIP_CUDA_TRY(cudaMemsetAsync(sums_.data(), 0, universe * sizeof(float), exec.stream()));
    GRADZIP_CUDA_TRY(cudaMemsetAsync(touched_.data(), 0, universe * sizeof(std::uint32_t), exec.stream()));
  }

  /// A payload's verdict from the host's check of all of it, read back (after a failure): the
  /// host's message. One after a bad payload in the same buffer may start unaligned, and its
  /// values cannot be read in place; the earlier failure is the one reported.
  wire::status host_verdict(cuda& exec, const std::uint8_t* base, const zen_expect& e, std::uint32_t ranks) {
    whole_.resize(static_cast<std::size_t>(e.size));
    gradzip::detail::zen_device::download(exec, whole_.data(), base + e.at, whole_.size());
    zen_part_view hv;
    const wire::status s = check_zen_part(whole_.data(), e.size, e.part, e.sender, e.phase, e.members, ranks, hv);
    return s.ok() ? wire::fail(wire::format_errc::section_misaligned, e.at, 0) : s;
  }

  /// Queues the kernels that write v.positions from the index section, checking them as they
  /// are read: a failure sets *bad. A bitmap's counts and their sum go to `counts` (2 words per
  /// bitmap word), CUB's scan to `temp`.
  void expand(cuda& exec, const std::uint8_t* indices, view& v, unsigned* bad, std::uint64_t* counts, std::byte* temp,
              std::size_t temp_bytes) {
    using namespace gradzip::detail;
    const zen_part& z = v.frame;
    if (z.encoding == encode::coo::id) {
      if (z.k != 0) {
        launch_over<policy>(exec, z.k, zen_device::coo_positions_kernel<>, indices, encode::coo::index_width(z.members),
                            z.k, z.members, v.positions.data(), bad);
      }
    } else if (z.encoding == encode::bitmap::id) {
      const std::uint64_t words = encode::bitmap::words(z.members);
      if (words == 0) return;  // then k is 0 (check_zen_frame: k <= members)
      std::uint64_t* first = counts + words;
      launch_over<policy>(exec, words, zen_device::bitmap_counts_kernel<>, indices, z.members, words, counts, bad);
      GRADZIP_CUDA_TRY(cub::DeviceScan::ExclusiveSum(temp, temp_bytes, counts, first, words, exec.stream()));
      launch_over<policy>(exec, words, zen_device::bitmap_positions_kernel<>, indices, words, counts, first, z.k,
                          v.positions.data(), bad);
    } else {
      const std::uint64_t chunks = encode::delta_varint::chunks(z.k);
      if (chunks != 0) {
        launch_over<policy>(exec, chunks, zen_device::delta_positions_kernel<>, indices, z.index_bytes, z.k, z.members,
                            encode::delta_varint::gap_width(z.members), chunks, v.positions.data(), bad);
      }
    }
  }

  gradzip::detail::device_buffer<std::uint32_t> position_;
  gradzip::detail::device_buffer<std::uint64_t> members_;
  std::uint64_t seed_;
  std::uint32_t parts_;
  std::vector<std::uint64_t> start_;
  growable<std::byte> workspace_;
  growable<float> sums_;
  growable<std::uint32_t> touched_;
  growable<std::uint32_t> at_;
  growable<double> staged_;
  growable<std::uint64_t> counts_;
  gradzip::detail::zen_device::pinned_bytes prefix_, totals_;
  std::vector<std::uint64_t> workspace_at_;
  std::vector<std::uint8_t> whole_, pending_;
  std::vector<const std::uint8_t*> indices_;
  std::vector<std::uint64_t> word_offset_;
  std::vector<unsigned> flags_;
};

}  // namespace gradzip::comm::detail

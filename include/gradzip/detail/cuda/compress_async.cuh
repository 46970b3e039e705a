// async_compress_backend<cuda>: codec::compress_async on a stream, with no host synchronization.
//
// `compress` needs a data-dependent count k on the host for one reason: the payload's layout
// (where each section starts) depends on k, and the selection writes into those sections. Here
// the count stays in device memory. One single-thread kernel reads it and computes the layout
// with the same HOST_DEVICE function the host uses. It then writes three things: the frame,
// the payload's size, and the selection's sink (its section pointers), the last into scratch.
// The selection kernels read that sink through a pointer. The bytes are compress's bytes. The
// cost is one more launch, and a sink read per kept element, which the L1 serves. A count above
// the bound `out` was sized for (compress would throw count_over_bound) writes nothing: the
// status word records it, `*size` is 0, and `exec.check()` throws it.
#pragma once

#include "gradzip/detail/cuda/status_word.cuh"
#include "gradzip/codec.hpp"

namespace gradzip::detail {

/// The selection's sink as the frame kernel leaves it in device memory: the section pointers,
/// and whether to emit at all (not when the count exceeds the payload's bound).
template <class Sink>
struct deferred_target {
  Sink sink;
  bool emit;
};

/// A sink whose target is written on the device before the selection runs.
template <class Sink>
struct deferred_sink {
  const deferred_target<Sink>* target;
  template <class V>
  GRADZIP_HOST_DEVICE void operator()(std::uint64_t pos, std::uint64_t index, V value) const {
    if (target->emit) target->sink(pos, index, value);
  }
};

/// Lays out the payload for the device's count. A count above `bound` (non-finite values are
/// always kept, so sampled top-k can exceed its 1.2 k) writes nothing: the failure goes to the
/// status word, the size is 0, and the selection emits nothing.
/// `sink` arrives with its values stage and context set; the kernel points it into the payload.
template <class Codec, class Sink>
__global__ __launch_bounds__(1)
void deferred_frame_kernel(std::uint8_t* out, element_type type, std::uint64_t n, const std::uint64_t* count,
                           std::uint64_t bound, Sink sink, deferred_target<Sink>* target, std::uint64_t* size,
                           wire::status* st) {
  const std::uint64_t k = *count;
  if (k > bound) {
    if (!failure_recorded(st)) *st = wire::fail(wire::format_errc::count_over_bound, k, bound);
    target->emit = false;
    *size = 0;
    return;
  }
  const wire::payload_layout l = Codec::layout(type, n, k);
  frame<Codec>::write_frame(out, l, type, n, k, frame_params{});
  sink.indices = Codec::has_indices ? out + l.at(1).offset : nullptr;
  sink.index_width = frame<Codec>::index_width(n);
  sink.values = out + l.at(Codec::section_count - 1).offset;
  target->sink = sink;
  target->emit = true;
  *size = l.total_bytes();
}

template <class = void>
__global__ __launch_bounds__(1)
void store_size_kernel(std::uint64_t* size, std::uint64_t bytes) { *size = bytes; }

template <>
struct async_compress_backend<cuda> {
  template <class Codec, class T>
  static void compress(cuda& exec, const Codec& c, span<const T> input, span<std::byte> out, std::uint64_t* size,
                       quantize::compress_context ctx) {
    if constexpr (!Codec::data_dependent_count) {
      // k is known on the host, so compress lays out the payload without waiting (a staged
      // index encoding, delta-varint or automatic, still sizes itself with one copy).
      const std::uint64_t bytes = c.compress(exec, input, out, ctx);
      launch(store_size_kernel<>, 1, 1, 0, exec.stream(), size, bytes);
    } else {
      using sink_type = payload_sink<T, typename Codec::values_type, typename Codec::indices_type>;
      using target_type = deferred_target<sink_type>;
      require_aligned(out.data(), "compress_async");
      const std::uint64_t n = input.size();
      // The target lives after the structure's scratch; reserve both first (growth discards).
      const std::size_t at = scratch_aligned(c.template workspace_bytes<T>(exec, n));
      exec.scratch(at + sizeof(target_type));
      const std::uint64_t* k = compressor<Codec>::count_on_device(c, exec, input);
      auto* target = reinterpret_cast<target_type*>(exec.scratch(at + sizeof(target_type)) + at);
      launch(deferred_frame_kernel<Codec, sink_type>, 1, 1, 0, exec.stream(),
             reinterpret_cast<std::uint8_t*>(out.data()), element_traits<T>::type, n, k,
             c.structure().selected_count(n), sink_type{nullptr, 0, nullptr, c.values(), ctx}, target, size,
             exec.status_word());
      compressor<Codec>::select_into(c, exec, input, deferred_sink<sink_type>{target});
    }
  }
};

}  // namespace gradzip::detail

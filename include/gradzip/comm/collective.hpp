/**
 * @file collective.hpp
 * @brief `comm::communicator` (what gradzip needs from a communication stack) and
 * `comm::allreducer` (compressed allreduce of one tensor on top of it).
 *
 * A communicator offers three collectives: an in-place sum of a typed buffer, an allgather of
 * one u64 per rank, and an allgather-v of bytes; and a personalized exchange (alltoall of
 * sizes, alltoall-v of bytes) with defaults built on those three, which adapters override. gradzip ships adapters for MPI
 * (`comm/mpi.hpp`) and NCCL (`comm/nccl.cuh`); for anything else (Gloo, a parameter server, a
 * test harness) derive from `communicator` and implement those three, as docs/communication.md
 * shows for Gloo.
 *
 * `allreducer<Codec, T, Exec>` averages one tensor over all ranks through a codec:
 *
 * - summable codecs (`codec::summable`: dense fp32, fp16 and bf16 casts, random-k with a shared
 *   seed, and any stage that declares `summed_as`, see gradzip/stage.hpp) compress, sum the
 *   payload's values section with one `allreduce_sum` (every rank's frame is the same), and
 *   decode once;
 * - all others compress, allgather the payload sizes, allgather-v the payloads, and decode each
 *   peer's payload into the output (scaled by 1 / ranks). Every received payload is validated;
 *   a bad one throws `gradzip::format_error` naming the rank that sent it, and nothing of it is
 *   applied.
 *
 * With feedback on, its state lives in the allreducer (one per tensor): error feedback's residual
 * (`feedback_mode::error_feedback`), or EF21's g_i and g (`feedback_mode::ef21`: the output is
 * then EF21's estimate g, see feedback/ef21.hpp). All buffers are sized at construction: a step
 * allocates nothing.
 *
 * @code
 * gradzip::comm::mpi_communicator comm{MPI_COMM_WORLD};
 * using topk = gradzip::codec<gradzip::sparsify::topk>;
 * gradzip::comm::allreducer<topk, float, gradzip::host> ar(exec, topk{gradzip::sparsify::topk::ratio(0.01)},
 *                                                          n, comm.size(), true);
 * ar.run(comm, exec, grad, {step, 0});   // grad <- average over ranks of the decoded payloads
 * @endcode
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradzip/codec.hpp"
#include "gradzip/core/element_type.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/core/span.hpp"
#include "gradzip/feedback/ef21.hpp"
#include "gradzip/feedback/error_feedback.hpp"
#include "gradzip/random/hash.hpp"
#include "gradzip/wire/reader.hpp"

namespace gradzip::comm {

namespace detail {

/// alltoall_sizes's argument check, shared by the adapters: size() sizes each way.
inline void check_alltoall_sizes(span<const std::uint64_t> mine, span<std::uint64_t> theirs, std::size_t ranks) {
  GRADZIP_EXPECTS(mine.size() == ranks && theirs.size() == ranks, "alltoall_sizes: ", mine.size(), " and ",
                  theirs.size(), " sizes for ", ranks, " ranks");
}

/// alltoallv_bytes's argument checks, shared by the adapters: size() sizes each way, `send`
/// exactly its parts, `recv` room for its parts.
inline void check_alltoallv(span<const std::byte> send, span<const std::uint64_t> send_sizes, span<std::byte> recv,
                            span<const std::uint64_t> recv_sizes, std::size_t ranks, const char* what) {
  GRADZIP_EXPECTS(send_sizes.size() == ranks && recv_sizes.size() == ranks, what, ": ", send_sizes.size(), " and ",
                  recv_sizes.size(), " sizes for ", ranks, " ranks");
  std::uint64_t sent = 0, received = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    sent += send_sizes[r];
    received += recv_sizes[r];
  }
  GRADZIP_EXPECTS(sent == send.size(), what, ": the parts add up to ", sent, " bytes, the send buffer holds ",
                  send.size());
  GRADZIP_EXPECTS(received <= recv.size(), what, ": ", received, " bytes to receive into ", recv.size());
}

}  // namespace detail

class communicator {
 public:
  virtual ~communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// data[0 .. count) <- the element-wise sum over all ranks, in place. Buffers are in the
  /// memory the implementation documents (host for MPI unless CUDA-aware, device for NCCL).
  virtual void allreduce_sum(void* data, std::size_t count, element_type type) = 0;
  /// sizes[r] <- rank r's `mine`, for every r (host memory).
  virtual void allgather_sizes(std::uint64_t mine, span<std::uint64_t> sizes) = 0;
  /// Every rank's `mine`, concatenated in rank order into `all`; sizes[r] is rank r's length
  /// (from allgather_sizes).
  virtual void allgatherv_bytes(span<const std::byte> mine, span<std::byte> all,
                                span<const std::uint64_t> sizes) = 0;

  /// theirs[r] <- rank r's mine[rank()]: the bytes rank r will send this rank, for every r
  /// (host memory, size() values each). The default runs size() allgather_sizes; adapters
  /// override it with one exchange (MPI_Alltoall; NCCL's grouped send and receive).
  virtual void alltoall_sizes(span<const std::uint64_t> mine, span<std::uint64_t> theirs) {
    const auto ranks = static_cast<std::size_t>(size());
    detail::check_alltoall_sizes(mine, theirs, ranks);
    std::vector<std::uint64_t> column(ranks);
    for (std::size_t p = 0; p < ranks; ++p) {
      allgather_sizes(mine[p], span<std::uint64_t>(column));  // column[r]: what rank r sends rank p
      if (p == static_cast<std::size_t>(rank())) std::copy(column.begin(), column.end(), theirs.begin());
    }
  }

  /// A personalized exchange. `send` holds size() parts back to back in rank order, part p
  /// (send_sizes[p] bytes) for rank p; `recv` receives the parts sent to this rank back to back
  /// in rank order, part r (recv_sizes[r] bytes, from alltoall_sizes) from rank r. Buffers are in
  /// the memory the implementation documents. The default goes through allgatherv_bytes in host
  /// memory, so every rank receives every part (size() times the bytes of a real alltoallv);
  /// adapters override it (MPI_Alltoallv; NCCL's grouped send and receive).
  virtual void alltoallv_bytes(span<const std::byte> send, span<const std::uint64_t> send_sizes,
                               span<std::byte> recv, span<const std::uint64_t> recv_sizes) {
    const auto ranks = static_cast<std::size_t>(size());
    const auto me = static_cast<std::size_t>(rank());
    detail::check_alltoallv(send, send_sizes, recv, recv_sizes, ranks, "alltoallv_bytes");
    // Where each rank's part for this rank starts in that rank's send buffer, and its total.
    std::vector<std::uint64_t> starts(ranks), at(ranks), totals(ranks);
    for (std::size_t p = 1; p < ranks; ++p) starts[p] = starts[p - 1] + send_sizes[p - 1];
    alltoall_sizes(span<const std::uint64_t>(starts), span<std::uint64_t>(at));
    allgather_sizes(static_cast<std::uint64_t>(send.size()), span<std::uint64_t>(totals));
    std::uint64_t all_bytes = 0;
    for (std::uint64_t t : totals) all_bytes += t;
    std::vector<std::byte> all(static_cast<std::size_t>(all_bytes));
    allgatherv_bytes(send, span<std::byte>(all), span<const std::uint64_t>(totals));
    std::uint64_t base = 0, out = 0;
    for (std::size_t r = 0; r < ranks; ++r) {
      GRADZIP_EXPECTS(at[r] <= totals[r] && recv_sizes[r] <= totals[r] - at[r], "alltoallv_bytes: rank ", r,
                      " sends ", totals[r], " bytes, its part for rank ", me, " would end at ", at[r] + recv_sizes[r]);
      if (recv_sizes[r] != 0) std::memcpy(recv.data() + out, all.data() + base + at[r], recv_sizes[r]);
      base += totals[r];
      out += recv_sizes[r];
    }
  }
  /// The CUDA stream (a cudaStream_t) the collectives are queued on, for a communicator whose
  /// collectives run on a GPU (NCCL); null for one that completes them before returning (MPI).
  /// allreducer<Codec, T, gradzip::cuda> orders its compress before them and its decode after
  /// them with events when this is not the executor's stream.
  virtual void* cuda_stream() const noexcept { return nullptr; }
};


/// What an allreducer keeps between steps for its tensor.
enum class feedback_mode {
  none,            ///< nothing: each step's payload is the gradient's
  error_feedback,  ///< the residual e (feedback::error_feedback): the payload is C(g + e)
  ef21,            ///< EF21's g_i and g (feedback::ef21): the payload is C(g - g_i), the output g
};

/// The word each rank announces before the gather, so that every rank reaches the same verdict
/// from the same words (a rank that judged alone could throw while the others wait for it):
/// bits 0-47 the payload's size, 48-62 a fingerprint of (n, the codec's bound, the element
/// type), bit 63 set when this rank's compress failed.
struct announcement {
  static constexpr int size_bits = 48;
  static constexpr std::uint64_t size_mask = (std::uint64_t{1} << size_bits) - 1;
  static constexpr std::uint64_t failed = std::uint64_t{1} << 63;
  /// 15 bits of a hash: ranks built for another tensor or codec differ, but for 1 in 32,768.
  static std::uint64_t fingerprint(std::uint64_t n, std::uint64_t bound, element_type type) {
    return (hash64(hash64(n, bound), static_cast<std::uint64_t>(type)) & 0x7FFFu) << size_bits;
  }
};

template <class Codec, class T, class Exec>
class allreducer {
  static_assert(is_element_v<T>, "allreducer<Codec, T, Exec>: T must be float, double, __half or __nv_bfloat16");
  using ops = gradzip::detail::executor_ops<Exec>;

 public:
  /// For a tensor of n elements over `ranks` ranks, keeping the state `mode` names.
  allreducer(Exec& exec, Codec codec, std::size_t n, int ranks, feedback_mode mode)
      : codec_(codec),
        n_(n),
        ranks_(checked_ranks(codec, n, ranks)),
        payload_(ops::template allocate_zeroed<std::byte>(exec, codec.template max_compressed_bytes<T>(n))),
        gathered_(ops::template allocate_zeroed<std::byte>(
            exec, summable_path() ? 0 : static_cast<std::size_t>(ranks) * codec.template max_compressed_bytes<T>(n))),
        sizes_(static_cast<std::size_t>(ranks)),
        peers_(static_cast<std::size_t>(ranks)),
        fingerprint_(announcement::fingerprint(n, codec.template max_compressed_bytes<T>(n), element_traits<T>::type)) {
    if (mode == feedback_mode::error_feedback) {
      feedback_ = std::make_unique<feedback::error_feedback<Codec, T, Exec>>(exec, codec, n);
    } else if (mode == feedback_mode::ef21) {
      ef21_ = std::make_unique<feedback::ef21<Codec, T, Exec>>(exec, codec, n);
    }
    exec.reserve(codec.template workspace_bytes<T>(exec, n));
  }

  /// Shorthand: `error_feedback` true is feedback_mode::error_feedback, false none.
  allreducer(Exec& exec, Codec codec, std::size_t n, int ranks, bool error_feedback)
      : allreducer(exec, codec, n, ranks, error_feedback ? feedback_mode::error_feedback : feedback_mode::none) {}

  /// Whether this codec goes through one allreduce of its payload (else a gather).
  /// (The values stage declares what its section sums as: stage::summed_as, gradzip/stage.hpp.)
  static constexpr bool summable_path() {
    return Codec::summable && stage::summed_as<typename Codec::values_type>(element_traits<T>::type).has_value();
  }

  /// Payload bytes this rank sent in the last `run`.
  std::size_t last_payload_bytes() const noexcept { return last_bytes_; }
  /// Bytes this rank put on the wire in the last `run` (the payload, plus 8 for its size on
  /// the gather path).
  std::size_t last_sent_bytes() const noexcept { return last_bytes_ + (summable_path() ? 0 : 8); }

  /// grad (in `exec`'s memory, n elements): in, this rank's gradient; out, the average over
  /// ranks of the decoded payloads (with EF21, its estimate g: the previous g plus that
  /// average). Collective: every rank calls it with the same codec and feedback mode.
  /// The gradient's and the communicator's sizes are checked before anything changes. A bad
  /// peer payload or a communication error is found after this rank compressed: its residual
  /// (error feedback) or g_i (EF21) has then taken the step that made the payload it sent,
  /// and EF21's g has not.
  ///
  /// Every rank throws together, never one while the others wait: ranks built for another n or
  /// codec (checked at the first run on the allreduce path, at every run on the gather path), a
  /// rank whose compress failed (a data-dependent codec's count_over_bound: that rank rethrows
  /// its own error, the others name it), and a bad payload all raise on every rank.
  void run(communicator& comm, Exec& exec, span<T> grad, quantize::compress_context ctx = {}) {
    GRADZIP_EXPECTS(grad.size() == n_, "allreducer: gradient has ", grad.size(), " elements, expected ", n_);
    GRADZIP_EXPECTS(comm.size() == ranks_, "allreducer: communicator has ", comm.size(), " ranks, built for ",
                    ranks_);
    span<std::byte> payload = ops::view(payload_);
    std::exception_ptr failure;  // the gather path reports it to every rank before rethrowing
    try {
      last_bytes_ = compress_local(exec, grad, payload, ctx);
    } catch (...) {
      if constexpr (summable_path()) throw;  // data-independent: a failure here is every rank's
      failure = std::current_exception();
      last_bytes_ = 0;
    }
    const float average = 1.0f / static_cast<float>(ranks_);
    // The collectives may run on a stream of their own (NCCL's): after compress, before decode.
    ops::hand_over(exec, comm.cuda_stream());
    if constexpr (summable_path()) {
      if (!agreed_) {  // once: ranks of another n or codec would allreduce different counts
        comm.allgather_sizes(fingerprint_, span<std::uint64_t>(sizes_));
        check_fingerprints(comm.rank());
        agreed_ = true;
      }
      // Every rank's frame is the same (same codec, n and count): sum the values section only.
      const wire::payload_layout l = Codec::layout(element_traits<T>::type, n_, codec_.structure().selected_count(n_));
      const auto& values = l.at(Codec::section_count - 1);
      const element_type type = *stage::summed_as<typename Codec::values_type>(element_traits<T>::type);
      comm.allreduce_sum(payload.data() + values.offset, values.size / element_size(type), type);
      ops::take_back(exec, comm.cuda_stream());
      gradzip::detail::payload_backend<Exec>::decode(exec, codec_, span<const std::byte>(payload.data(), last_bytes_),
                                                      grad, average, true);
      check(exec);
    } else {
      comm.allgather_sizes(fingerprint_ | last_bytes_ | (failure ? announcement::failed : 0),
                           span<std::uint64_t>(sizes_));
      const std::uint64_t total = check_announcements(comm.rank(), failure);
      span<std::byte> all = ops::view(gathered_);
      comm.allgatherv_bytes(span<const std::byte>(payload.data(), last_bytes_), all.subspan(0, total),
                            span<const std::uint64_t>(sizes_));
      ops::take_back(exec, comm.cuda_stream());
      std::uint64_t at = 0;
      for (int r = 0; r < ranks_; ++r) {
        peers_[static_cast<std::size_t>(r)] = span<const std::byte>(all.data() + at, sizes_[r]);
        at += sizes_[r];
      }
      decode_peers(exec, grad, average);
    }
    if (ef21_) ef21_->apply(exec, grad);
  }

  /// The feedback state (error feedback's residual, or EF21's g_i and g), for checkpoints.
  std::vector<std::byte> save(Exec& exec) const {
    GRADZIP_EXPECTS(feedback_ || ef21_, "allreducer::save: feedback is off: no state");
    return feedback_ ? feedback_->save(exec) : ef21_->save(exec);
  }
  void restore(Exec& exec, span<const std::byte> bytes) {
    GRADZIP_EXPECTS(feedback_ || ef21_, "allreducer::restore: feedback is off: no state");
    if (feedback_) {
      feedback_->restore(exec, bytes);
    } else {
      ef21_->restore(exec, bytes);
    }
  }

 private:
  /// On CUDA, decode errors surface at check(); the host decoder throws by itself.
  static void check(Exec& exec) {
    if constexpr (!std::is_same_v<Exec, host>) exec.check();
  }

  static int checked_ranks(const Codec& codec, std::size_t n, int ranks) {
    GRADZIP_EXPECTS(ranks >= 1, "allreducer: ranks must be >= 1, got ", ranks);
    const std::uint64_t bound = codec.template max_compressed_bytes<T>(n);
    GRADZIP_EXPECTS(bound <= announcement::size_mask, "allreducer: payloads of up to ", bound,
                    " bytes: the gather announces sizes below 2^48");
    GRADZIP_EXPECTS(summable_path() || bound <= SIZE_MAX / static_cast<std::uint64_t>(ranks), "allreducer: ", ranks,
                    " payloads of up to ", bound, " bytes overflow a size");
    return ranks;
  }

  std::size_t compress_local(Exec& exec, span<T> grad, span<std::byte> payload, quantize::compress_context ctx) {
    if (feedback_) return feedback_->compress(exec, span<const T>(grad), payload, ctx);
    if (ef21_) return ef21_->compress(exec, span<const T>(grad), payload, ctx);
    return codec_.compress(exec, span<const T>(grad), payload, ctx);
  }

  /// Every rank's fingerprint (in sizes_) equals this one's: the same verdict on every rank.
  void check_fingerprints(int me) const {
    for (int r = 0; r < ranks_; ++r) {
      const std::uint64_t theirs = sizes_[r] & ~announcement::size_mask & ~announcement::failed;
      const std::uint64_t first = sizes_[0] & ~announcement::size_mask & ~announcement::failed;
      GRADZIP_EXPECTS(theirs == first, "allreducer: rank ", r, " was built for another tensor or codec than rank 0 (n, ",
                      "the payload bound or the element type differ; this is rank ", me, ")");
    }
  }

  /// The gather's announcements, judged alike on every rank (they see the same words): the
  /// fingerprints agree, no rank's compress failed (this rank rethrows its own error), and
  /// every size is within the bound and a multiple of 16 (payloads are; later ones stay
  /// aligned). Returns the sizes' total; sizes_ then holds the sizes alone.
  std::uint64_t check_announcements(int me, const std::exception_ptr& failure) {
    check_fingerprints(me);
    for (int r = 0; r < ranks_; ++r) {
      if ((sizes_[r] & announcement::failed) == 0) continue;
      if (r == me && failure) std::rethrow_exception(failure);
      throw error(gradzip::detail::concat("allreducer: rank ", r, " could not compress its gradient (its own error says ",
                                          "why); no rank applied this step"));
    }
    const std::uint64_t most = codec_.template max_compressed_bytes<T>(n_);
    std::uint64_t total = 0;
    for (int r = 0; r < ranks_; ++r) {
      sizes_[r] &= announcement::size_mask;
      if (sizes_[r] > most) {
        throw format_error(wire::format_errc::truncated,
                           gradzip::detail::concat("allreducer: rank ", r, " announced a ", sizes_[r],
                                                   "-byte payload, larger than the codec's bound ", most));
      }
      if (sizes_[r] % 16 != 0) {
        throw format_error(wire::format_errc::bad_total_size,
                           gradzip::detail::concat("allreducer: rank ", r, " announced a ", sizes_[r],
                                                   "-byte payload: payloads are multiples of 16 bytes"));
      }
      total += sizes_[r];
    }
    return total;
  }

  /// grad <- average * the sum of the peers' decoded payloads, every payload validated before
  /// any is applied. Host: codec::decompress_add_all's machinery (all validated, then applied
  /// one after another); CUDA: every peer's checks, one wait, then the decodes (without
  /// validating again) and a second wait: two host synchronizations, whatever the ranks.
  void decode_peers(Exec& exec, span<T> grad, float average) {
    std::size_t bad = 0;
    try {
      if constexpr (std::is_same_v<Exec, host>) {
        gradzip::detail::payload_backend<host>::decode_all(exec, codec_, span<const span<const std::byte>>(peers_),
                                                           grad, average, true, bad);
      } else {
        // Every peer is checked before any is decoded, so that a bad payload leaves grad as it
        // was: the checks queued back to back, then one wait. Only when one failed are they
        // run again one at a time, to name the first bad rank.
        for (const auto& peer : peers_) gradzip::detail::payload_backend<Exec>::check(exec, codec_, peer, grad.size());
        try {
          check(exec);
        } catch (const format_error&) {
          for (bad = 0; bad < peers_.size(); ++bad) {
            gradzip::detail::payload_backend<Exec>::check(exec, codec_, peers_[bad], grad.size());
            check(exec);
          }
          throw;  // not reached: the same checks, in the same order, fail again
        }
        for (const auto& peer : peers_) {
          gradzip::detail::payload_backend<Exec>::decode_checked(exec, codec_, peer, grad, average,
                                                                 &peer == peers_.data());
        }
      }
    } catch (const format_error& e) {
      throw format_error(e.code(), gradzip::detail::concat("allreducer: payload from rank ", bad, ": ", e.what()));
    }
    check(exec);  // the decodes' launches
  }

  Codec codec_;
  std::size_t n_;
  int ranks_;
  typename ops::template buffer<std::byte> payload_;
  typename ops::template buffer<std::byte> gathered_;
  std::vector<std::uint64_t> sizes_;
  std::vector<span<const std::byte>> peers_;  // each rank's payload inside gathered_
  std::uint64_t fingerprint_ = 0;             // announcement::fingerprint of this allreducer
  bool agreed_ = false;                       // the allreduce path's fingerprints were compared
  std::unique_ptr<feedback::error_feedback<Codec, T, Exec>> feedback_;  // null: no error feedback
  std::unique_ptr<feedback::ef21<Codec, T, Exec>> ef21_;                // null: no EF21
  std::size_t last_bytes_ = 0;
};

}  // namespace gradzip::comm

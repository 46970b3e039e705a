/**
 * @file planned_allreducer.hpp
 * @brief `comm::planned_allreducer<T, Exec>`: averages a model's gradients over the ranks as a
 * `schedule::plan` says: its fusion groups, and for each group the codec and the route the
 * planner chose (Espresso's per-group decision, docs/scheduling.md).
 *
 * A plan names codecs by the cost model's names ("topk1", "qsgd4", "fp32"); the types behind
 * those names are yours. Give a `plan_codec` for each (name, route) the plan may use; one name
 * may have two, say top-k by allgather and by sparse synchronization:
 *
 * - `plan_codec<T, Exec>::of(name, codec, feedback)`: an `allreducer` with that codec, which
 *   travels by allreduce when the codec is summable and by allgather otherwise. The plan's route
 *   for the group must be that one.
 * - `plan_codec<T, Exec>::uncompressed(name)`: the gradient as it is, summed by allreduce (the
 *   cost model's `identity` codec, "fp32").
 * - `plan_codec<float, Exec>::sparse(name, codec, feedback, seed)`: a sparsifying codec whose
 *   selected entries are summed by Zen's sparse synchronization (`comm::basic_sparse_sync`),
 *   the plan's `sparse_sync` route. Float gradients, either executor.
 *
 * Every group runs on the executor given to `run`: a plan that offloads a group to the host
 * (`executor_kind::host`) is refused, as is a route the named codec does not take, a codec
 * index outside the cost model, or a name without a `plan_codec`; each error names the group.
 * Group g compresses with tensor id `ctx.tensor_id + g`, as `fusion::fused_compressor` does.
 *
 * @code
 * using topk = gradzip::codec<gradzip::sparsify::topk>;
 * using gradzip::comm::plan_codec;
 * gradzip::comm::planned_allreducer<float, gradzip::host> sync(
 *     exec, sizes, plan, model,   // tensor sizes in backprop order, the plan, its cost model
 *     {plan_codec<float, gradzip::host>::uncompressed("fp32"),
 *      plan_codec<float, gradzip::host>::of("topk1", topk{gradzip::sparsify::topk::ratio(0.01)},
 *                                           gradzip::comm::feedback_mode::error_feedback)},
 *     comm.size());
 * sync.run(comm, exec, gradzip::span<float>(bucket), {step, 0});   // the tensors back to back
 * @endcode
 */
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gradzip/comm/collective.hpp"
#include "gradzip/comm/sparse_sync.hpp"
#include "gradzip/fusion/layout.hpp"
#include "gradzip/schedule/timeline.hpp"

namespace gradzip::comm {

/// One fusion group's synchronization, whatever its codec.
template <class T, class Exec>
struct group_sync {
  virtual ~group_sync() = default;
  /// grad: the group's elements; in, this rank's gradient; out, the average over the ranks.
  virtual void run(communicator& comm, Exec& exec, span<T> grad, quantize::compress_context ctx) = 0;
  /// Bytes this rank put on the wire in the last `run`.
  virtual std::size_t sent_bytes() const = 0;
};

/// A codec a plan may name: its name in the cost model, the route it travels by, and how to
/// build its synchronization for a group of n elements over `ranks` ranks.
template <class T, class Exec>
struct plan_codec {
  using builder = std::function<std::unique_ptr<group_sync<T, Exec>>(Exec&, std::size_t n, int ranks)>;
  std::string name;
  schedule::route path = schedule::route::allreduce;
  builder build;

  /// `codec` through an `allreducer` (allreduce when summable, else allgather).
  template <class Codec>
  static plan_codec of(std::string name, Codec codec, feedback_mode mode = feedback_mode::none) {
    using reducer = allreducer<Codec, T, Exec>;
    const schedule::route path = reducer::summable_path() ? schedule::route::allreduce : schedule::route::allgather;
    return {std::move(name), path, [codec, mode](Exec& exec, std::size_t n, int ranks) {
              return std::unique_ptr<group_sync<T, Exec>>(new by_allreducer<Codec>(exec, codec, n, ranks, mode));
            }};
  }

  /// The gradient itself, summed by allreduce: a dense codec without quantization, so the
  /// values section is the gradient (one copy in, one scaled copy out).
  static plan_codec uncompressed(std::string name = "fp32") {
    return of(std::move(name), codec<sparsify::none, quantize::none, encode::none>{});
  }

  /// A sparsifying `codec` whose selection is summed by `comm::basic_sparse_sync` (Zen's
  /// Balanced Parallelism), `seed` keying its partition. Each step: compress (with error
  /// feedback when `mode` says so), decode the payload, and send the nonzero entries it holds
  /// (a selected zero adds nothing). The entry lists grow to the largest selection, then stay.
  template <class Codec>
  static plan_codec sparse(std::string name, Codec codec, feedback_mode mode = feedback_mode::none,
                           std::uint64_t seed = 0) {
    static_assert(std::is_same_v<T, float>, "plan_codec::sparse: comm::sparse_sync sums float gradients");
    static_assert(Codec::has_indices, "plan_codec::sparse: the codec must select explicit indices (top-k, threshold)");
    GRADZIP_EXPECTS(mode != feedback_mode::ef21, "plan_codec::sparse: EF21 is not supported on the sparse_sync route");
    return {std::move(name), schedule::route::sparse_sync, [codec, mode, seed](Exec& exec, std::size_t n, int ranks) {
              return std::unique_ptr<group_sync<float, Exec>>(new by_sparse_sync<Codec>(exec, codec, n, ranks, mode, seed));
            }};
  }

 private:
  template <class Codec>
  struct by_allreducer final : group_sync<T, Exec> {
    allreducer<Codec, T, Exec> all;
    by_allreducer(Exec& exec, Codec c, std::size_t n, int ranks, feedback_mode mode) : all(exec, c, n, ranks, mode) {}
    void run(communicator& comm, Exec& exec, span<T> grad, quantize::compress_context ctx) override {
      all.run(comm, exec, grad, ctx);
    }
    std::size_t sent_bytes() const override { return all.last_sent_bytes(); }
  };

  template <class Codec>
  struct by_sparse_sync final : group_sync<float, Exec> {
    using ops = gradzip::detail::executor_ops<Exec>;
    Codec codec;
    std::unique_ptr<feedback::error_feedback<Codec, float, Exec>> ef;  // null: no error feedback
    basic_sparse_sync<Exec> zen;
    typename ops::template buffer<std::byte> payload;
    typename ops::template buffer<float> decoded;
    by_sparse_sync(Exec& exec, Codec c, std::size_t n, int ranks, feedback_mode mode, std::uint64_t seed)
        : codec(c), zen(n, ranks, seed),
          payload(ops::template allocate_zeroed<std::byte>(exec, c.template max_compressed_bytes<float>(n))),
          decoded(ops::template allocate_zeroed<float>(exec, n)) {
      if (mode == feedback_mode::error_feedback) ef = std::make_unique<feedback::error_feedback<Codec, float, Exec>>(exec, c, n);
      exec.reserve(c.template workspace_bytes<float>(exec, n));
    }
    void run(communicator& comm, Exec& exec, span<float> grad, quantize::compress_context ctx) override {
      const span<std::byte> out = ops::view(payload);
      const std::size_t bytes = ef ? ef->compress(exec, span<const float>(grad), out, ctx)
                                   : codec.compress(exec, span<const float>(grad), out, ctx);
      codec.decompress(exec, span<const std::byte>(out.data(), bytes), ops::view(decoded));
      // The selection's nonzeros go; the sum replaces grad only once every part was valid.
      zen.sum_nonzeros(comm, exec, ops::view(decoded), grad, 1.0f / static_cast<float>(comm.size()));
    }
    std::size_t sent_bytes() const override { return static_cast<std::size_t>(zen.last_traffic().sent()); }
  };
};

template <class T, class Exec>
class planned_allreducer {
 public:
  /// `tensor_sizes`: the model's tensors in backprop order (the flat buffer's layout);
  /// `p`: the groups and options (`schedule::plan_from_json` or a planner); `model`: the cost
  /// model the plan indexes codecs in; `codecs`: a `plan_codec` for each name the plan uses.
  /// Builds every group's state now: a step allocates nothing.
  planned_allreducer(Exec& exec, std::vector<std::size_t> tensor_sizes, const schedule::plan& p,
                     const schedule::cost_model& model, const std::vector<plan_codec<T, Exec>>& codecs, int ranks)
      : layout_(std::move(tensor_sizes), p.group_starts), ranks_(ranks) {
    GRADZIP_EXPECTS(ranks >= 1, "planned_allreducer: ranks must be >= 1, got ", ranks);
    GRADZIP_EXPECTS(p.options.size() == layout_.group_count(), "planned_allreducer: the plan has ",
                    layout_.group_count(), " groups but ", p.options.size(), " options");
    for (std::size_t g = 0; g < p.options.size(); ++g) groups_.push_back(build(exec, p.options[g], model, codecs, g));
  }

  const fusion::layout& layout() const noexcept { return layout_; }
  std::size_t size() const noexcept { return layout_.total(); }

  /// grad: every tensor back to back in backprop order (layout()); in, this rank's gradients;
  /// out, their averages over the ranks. Collective: the groups run in order, each with
  /// tensor id ctx.tensor_id + g.
  void run(communicator& comm, Exec& exec, span<T> grad, quantize::compress_context ctx = {}) {
    GRADZIP_EXPECTS(grad.size() == layout_.total(), "planned_allreducer: gradient has ", grad.size(),
                    " elements, the plan's tensors ", layout_.total());
    GRADZIP_EXPECTS(comm.size() == ranks_, "planned_allreducer: communicator has ", comm.size(), " ranks, built for ",
                    ranks_);
    sent_ = 0;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      groups_[g]->run(comm, exec, grad.subspan(layout_.group_offset(g), layout_.group_size(g)),
                      {ctx.step, ctx.tensor_id + g});
      sent_ += groups_[g]->sent_bytes();
    }
  }

  /// Bytes this rank put on the wire in the last `run`, all groups together.
  std::size_t last_sent_bytes() const noexcept { return sent_; }

 private:
  std::unique_ptr<group_sync<T, Exec>> build(Exec& exec, const schedule::option& o, const schedule::cost_model& model,
                                             const std::vector<plan_codec<T, Exec>>& codecs, std::size_t g) const {
    GRADZIP_EXPECTS(o.codec < model.codecs.size(), "planned_allreducer: group ", g, " names codec ", o.codec,
                    ", but the cost model has ", model.codecs.size());
    const std::string& name = model.codecs[o.codec].name;
    GRADZIP_EXPECTS(o.where == schedule::executor_kind::device, "planned_allreducer: group ", g, " (", name,
                    ") is offloaded to the host; every group runs on the executor given to run");
    for (const plan_codec<T, Exec>& c : codecs) {
      if (c.name == name && c.path == o.path) return c.build(exec, layout_.group_size(g), ranks_);
    }
    std::string known, routes;
    for (const plan_codec<T, Exec>& c : codecs) {
      known += (known.empty() ? "" : ", ") + c.name;
      if (c.name == name) routes += std::string(routes.empty() ? "" : " or ") + schedule::name(c.path);
    }
    GRADZIP_EXPECTS(routes.empty(), "planned_allreducer: group ", g, " sends ", name, " by ", schedule::name(o.path),
                    ", but its plan_codec travels by ", routes);
    throw invalid_argument(gradzip::detail::concat("planned_allreducer: group ", g, " names codec '", name,
                                                   "', which has no plan_codec (given: ", known, ")"));
  }

  fusion::layout layout_;
  int ranks_;
  std::vector<std::unique_ptr<group_sync<T, Exec>>> groups_;
  std::size_t sent_ = 0;
};

}  // namespace gradzip::comm

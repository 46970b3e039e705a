/**
 * @file planner.hpp
 * @brief The Cupcake scheduler (fusion group boundaries for one codec) and the Espresso
 * planner (boundaries and, per group, how to synchronize it), both minimizing the simulated
 * iteration time of timeline.hpp; and the exhaustive search that checks them on small cases.
 *
 * Cupcake (Wang et al., MLSys '23) fuses consecutive tensors into groups and compresses each
 * group once; Espresso (Wang et al., EuroSys '23) decides per tensor whether and how to
 * compress: which codec, which collective, GPU or CPU. Both reduce to one search here: cut the
 * tensors (in backprop order) into groups, and give each group an option from a list (Cupcake:
 * a list of one).
 *
 * The search is a dynamic program over the group boundaries. Its state after the groups that
 * end at tensor j is the resource clock of timeline.hpp: when each resource is next free. The
 * next groups' timeline depends only on that clock, and grows with it in every component, so a
 * clock that is no earlier anywhere than another at the same boundary can be dropped: the DP
 * keeps, per boundary, the clocks no other clock dominates (a Pareto frontier). Every clock
 * entry earlier than the compute resource's is raised to it first (no later group is ready
 * before then), which merges most states. Kept whole, the frontier makes the program exact for
 * the model; `planner_settings::frontier` bounds it (keeping the clocks with the earliest
 * possible iteration end) and `planner_settings::tolerance` merges clocks that differ by less
 * than it, which makes it a heuristic with a known cost: `planned::dropped` counts what they
 * dropped, and tests compare the result with exhaustive search (within 2 %; in practice within
 * 0.01 %). ResNet-50's 161 tensors with 8 options take about 0.1 s. Cupcake's paper finds its optimal fusion by a search of its own; we use
 * this program because it is exact for our timeline (which overlaps compression, network and
 * decoding across groups, so the iteration time is not unimodal in the group size, which a
 * binary search would need) and still takes milliseconds for ResNet-50's 161 tensors.
 *
 * @code
 * gradzip::schedule::planned p = gradzip::schedule::espresso_plan(w, model, options);
 * gradzip::fusion::layout l(w.sizes, p.chosen.group_starts);
 * @endcode
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "gradzip/core/error.hpp"
#include "gradzip/schedule/timeline.hpp"

namespace gradzip::schedule {

struct planner_settings {
  std::size_t frontier = 8;           ///< clocks kept per boundary (the DP is exact while none is dropped)
  std::size_t max_group_tensors = 0;  ///< most tensors in a group (0: no limit)
  /// Clocks within this many seconds of each other in every resource count as equal (one is
  /// dropped). Negative: 1e-4 of the workload's total backward time.
  double tolerance = -1.0;
};

/// A plan and its simulated iteration time.
struct planned {
  plan chosen;
  double iteration_s = 0.0;
  std::size_t dropped = 0;  ///< clocks the frontier bound or the tolerance dropped (0: the plan is optimal for the model)
};

namespace detail {

/// Prefix sums: backward[j] = backward time of tensors 0..j-1, elements[j] = their elements.
struct prefix {
  std::vector<double> backward;
  std::vector<double> elements;
  explicit prefix(const workload& w) : backward(w.sizes.size() + 1, 0.0), elements(w.sizes.size() + 1, 0.0) {
    for (std::size_t t = 0; t < w.sizes.size(); ++t) {
      backward[t + 1] = backward[t] + w.backward_s[t];
      elements[t + 1] = elements[t] + static_cast<double>(w.sizes[t]);
    }
  }
};

/// a is no later than b (give or take `tolerance`) on every resource.
inline bool dominates(const resource_clock& a, const resource_clock& b, double tolerance) {
  for (int r = 0; r < resource_count; ++r) {
    if (a[r] > b[r] + tolerance) return false;
  }
  return true;
}

inline void check_inputs(const workload& w, const cost_model& m, const std::vector<option>& options) {
  w.check();
  m.validate();
  GRADZIP_EXPECTS(!options.empty(), "planner: no options to choose from");
  for (const option& o : options) m.check(o);
}

}  // namespace detail

/// The plan with the least simulated iteration time: group boundaries, and for each group one
/// of `options` (Espresso's planner; with one option, Cupcake's scheduler).
inline planned espresso_plan(const workload& w, const cost_model& m, const std::vector<option>& options,
                             planner_settings settings = {}) {
  detail::check_inputs(w, m, options);
  GRADZIP_EXPECTS(settings.frontier >= 1, "espresso_plan: settings.frontier must be >= 1, got ", settings.frontier);
  GRADZIP_EXPECTS(std::isfinite(settings.tolerance), "espresso_plan: settings.tolerance must be finite (negative: the default), got ",
                  settings.tolerance);
  const std::size_t n = w.sizes.size();
  planned out;
  if (n == 0) {
    out.iteration_s = w.forward_s;
    return out;
  }
  const detail::prefix pre(w);
  const double tolerance = settings.tolerance >= 0.0 ? settings.tolerance : 1e-4 * pre.backward[n];
  struct node {
    resource_clock clock;
    std::size_t from = 0;   // the boundary of the previous group's end
    std::size_t parent = 0;  // its node there
    std::size_t option = 0;
  };
  std::vector<std::vector<node>> at(n + 1);
  at[0].push_back(node{});
  // The earliest the iteration can end from a node at boundary i: backprop still has the rest.
  const auto bound = [&](const node& a, std::size_t i) {
    return std::max(iteration_seconds(w, a.clock), w.forward_s + a.clock[compute] + pre.backward[n] - pre.backward[i]);
  };
  // Keeps the `frontier` clocks at boundary i that could still end earliest.
  const auto prune = [&](std::size_t i) {
    auto& here = at[i];
    if (here.size() <= settings.frontier) return;
    std::stable_sort(here.begin(), here.end(), [&](const node& a, const node& b) { return bound(a, i) < bound(b, i); });
    out.dropped += here.size() - settings.frontier;
    here.resize(settings.frontier);
  };
  for (std::size_t i = 0; i < n; ++i) {
    prune(i);
    auto& here = at[i];
    // The limit is compared with what is left, not added to i: i + SIZE_MAX would wrap.
    const std::size_t most = settings.max_group_tensors;
    const std::size_t last = most == 0 || most >= n - i ? n : i + most;
    for (std::size_t j = i + 1; j <= last; ++j) {
      for (std::size_t o = 0; o < options.size(); ++o) {
        stage stages[max_stages];
        const int count = group_stages(m, options[o], pre.elements[j] - pre.elements[i], w.element_bytes, stages);
        for (std::size_t k = 0; k < here.size(); ++k) {
          node next{here[k].clock, i, k, o};
          advance(next.clock, pre.backward[j] - pre.backward[i], stages, count);
          for (double& t : next.clock) t = std::max(t, next.clock[compute]);  // nothing later starts earlier
          auto& there = at[j];
          bool beaten = false;
          for (const node& other : there) {
            if (detail::dominates(other.clock, next.clock, tolerance)) {
              beaten = true;
              if (!detail::dominates(other.clock, next.clock, 0.0)) ++out.dropped;  // equal only within the tolerance
              break;
            }
          }
          if (beaten) continue;
          there.erase(std::remove_if(there.begin(), there.end(),
                                     [&](const node& other) { return detail::dominates(next.clock, other.clock, 0.0); }),
                      there.end());
          there.push_back(next);
          if (there.size() > 4 * settings.frontier) prune(j);  // bounds the cost of the dominance checks
        }
      }
    }
  }
  const auto& end = at[n];
  std::size_t best = 0;
  for (std::size_t k = 1; k < end.size(); ++k) {
    if (bound(end[k], n) < bound(end[best], n)) best = k;
  }
  out.iteration_s = bound(end[best], n);
  // Walk back through the parents: group starts and options, last group first.
  for (std::size_t j = n, k = best; j != 0;) {
    const node& v = at[j][k];
    out.chosen.group_starts.push_back(v.from);
    out.chosen.options.push_back(options[v.option]);
    j = v.from;
    k = v.parent;
  }
  std::reverse(out.chosen.group_starts.begin(), out.chosen.group_starts.end());
  std::reverse(out.chosen.options.begin(), out.chosen.options.end());
  return out;
}

/// Cupcake's scheduler: the fusion groups that minimize the simulated iteration time when every
/// group is synchronized by `o`.
inline planned cupcake_schedule(const workload& w, const cost_model& m, const option& o, planner_settings settings = {}) {
  return espresso_plan(w, m, std::vector<option>{o}, settings);
}

/// Every way to cut at most 12 tensors into groups and give each group one of `options`,
/// simulated; the best. For checking the planners: it runs options · (options + 1)^(n - 1)
/// group timelines.
inline planned exhaustive_plan(const workload& w, const cost_model& m, const std::vector<option>& options) {
  detail::check_inputs(w, m, options);
  const std::size_t n = w.sizes.size();
  GRADZIP_EXPECTS(n <= 12, "exhaustive_plan: at most 12 tensors, got ", n);
  const detail::prefix pre(w);
  planned best;
  best.iteration_s = std::numeric_limits<double>::infinity();
  plan current;
  // Depth first from boundary i with `clock`; `current` holds the groups so far.
  const auto search = [&](const auto& self, std::size_t i, const resource_clock& clock) -> void {
    if (i == n) {
      const double t = iteration_seconds(w, clock);
      if (t < best.iteration_s) {
        best.iteration_s = t;
        best.chosen = current;
      }
      return;
    }
    for (std::size_t j = i + 1; j <= n; ++j) {
      for (const option& o : options) {
        stage stages[max_stages];
        const int count = group_stages(m, o, pre.elements[j] - pre.elements[i], w.element_bytes, stages);
        resource_clock next = clock;
        advance(next, pre.backward[j] - pre.backward[i], stages, count);
        current.group_starts.push_back(i);
        current.options.push_back(o);
        self(self, j, next);
        current.group_starts.pop_back();
        current.options.pop_back();
      }
    }
  };
  search(search, 0, resource_clock{});
  if (n == 0) best.iteration_s = w.forward_s;
  return best;
}

}  // namespace gradzip::schedule

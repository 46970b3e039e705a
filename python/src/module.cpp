// gradzip._gradzip: the nanobind module behind the `gradzip` Python package.
//
// Arrays come in through DLPack or the buffer protocol (torch tensors, numpy arrays, bytes), so
// the module needs no torch headers: it builds in seconds against any torch. Every call checks
// its arrays (dtype, device, contiguity, size) and names the argument it refuses; gradzip's own
// errors keep their messages: invalid_argument -> ValueError, format_error -> gradzip.FormatError
// (a ValueError), anything else from gradzip -> RuntimeError. Compute runs without the GIL.
//
// CUDA arrays (GRADZIP_PYTHON_CUDA builds) run the same codec on gradzip::cuda, ordered with the
// stream the caller names (the Python package passes torch's current stream on the array's
// device); this file stays host-compiled and reaches them through device.hpp's interfaces.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <gradzip/lowrank/powersgd.hpp>

#include <map>
#include <mutex>
#include <set>

#include "erased.hpp"

namespace nb = nanobind;
using namespace gradzip_py;

namespace gradzip_py {

std::unique_ptr<any_codec> make_codec(const parsed_spec& spec) {
  static const std::set<std::string> structures = {"dense",          "topk",        "randomk", "threshold",
                                                   "sampled_topk",   "blockwise_topk", "hashed_topk",
                                                   "simhash",        "hadamard"};
  static const std::set<std::string> values = {"none", "fp32", "fp16", "bf16",     "fp8_e4m3", "fp8_e5m2",   "uniform",
                                               "qsgd", "terngrad", "sign", "scaled_sign", "onebit", "natural"};
  static const std::set<std::string> encodings = {"coo", "bitmap", "delta_varint", "automatic"};
  roles r;
  int role = 0;  // stages come in the order structure, values, encoding; each at most once
  for (const stage& st : spec.stages) {
    const int this_role = structures.count(st.name) ? 0 : values.count(st.name) ? 1 : encodings.count(st.name) ? 2 : -1;
    if (this_role < 0) {
      not_built(spec, "unknown stage '" + st.name +
                          "'; structures: dense topk randomk threshold sampled_topk blockwise_topk hashed_topk simhash "
                          "hadamard; values: none fp16 bf16 fp8_e4m3 fp8_e5m2 uniform qsgd terngrad sign scaled_sign "
                          "onebit natural; encodings: coo bitmap delta_varint automatic");
    }
    GRADZIP_EXPECTS(this_role >= role, "codec spec '", spec.text, "': stage '", st.name,
                    "' is out of order (structure, then values, then encoding, each at most once)");
    const stage** slot = this_role == 0 ? &r.structure : this_role == 1 ? &r.values : &r.encoding;
    GRADZIP_EXPECTS(*slot == nullptr, "codec spec '", spec.text, "': two ",
                    this_role == 0 ? "structure" : this_role == 1 ? "values" : "encoding", " stages");
    *slot = &st;
    role = this_role;
  }
  if (auto c = make_dense_family(spec, r)) return c;
  if (auto c = make_topk_family(spec, r)) return c;
  if (auto c = make_sparse_family(spec, r)) return c;
  not_built(spec, "no codec for structure '" + r.structure->name + "'");
}

}  // namespace gradzip_py

namespace {

using any_array = nb::ndarray<nb::ro>;
using out_array = nb::ndarray<>;

std::string where(int device) { return device < 0 ? std::string("the CPU") : "cuda:" + std::to_string(device); }

/// Where an array's memory is: -1 for the CPU, else its CUDA device's index.
template <class A>
int device_of(const A& a, const std::string& what) {
  if (a.device_type() == nb::device::cpu::value) return -1;
  if (a.device_type() == nb::device::cuda::value) return static_cast<int>(a.device_id());
  throw nb::type_error((what + " is neither in CPU nor in CUDA memory (DLPack device type " +
                        std::to_string(a.device_type()) + ")")
                           .c_str());
}

/// The device of a call's arrays (-1: the CPU), after checking they are all on it.
int one_device(const std::vector<std::pair<int, std::string>>& placed) {
  for (const auto& [device, what] : placed) {
    if (device != placed.front().first) {
      throw nb::value_error((what + " is on " + where(device) + " and " + placed.front().second + " on " +
                             where(placed.front().first) + ": a call's arrays must be on one device")
                                .c_str());
    }
  }
  return placed.front().first;
}

/// Number of elements, after checking the array is C-contiguous.
template <class A>
std::size_t checked_elements(const A& a, const char* what) {
  std::size_t n = 1;
  std::int64_t expect = 1;
  for (std::size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expect) {
      throw nb::value_error((std::string(what) + " is not contiguous: call .contiguous() first").c_str());
    }
    expect *= static_cast<std::int64_t>(a.shape(d));
    n *= a.shape(d);
  }
  return n;
}

template <class A>
gz::span<float> floats(const A& a, const char* what) {
  if (a.dtype() != nb::dtype<float>()) {
    throw nb::type_error((std::string(what) + " must be float32: the Python module builds float32 codecs").c_str());
  }
  const std::size_t n = checked_elements(a, what);
  return gz::span<float>(static_cast<float*>(const_cast<void*>(static_cast<const void*>(a.data()))), n);
}

template <class A>
gz::span<std::byte> bytes(const A& a, const char* what) {
  if (a.dtype() != nb::dtype<std::uint8_t>() && a.dtype() != nb::dtype<std::int8_t>()) {
    throw nb::type_error((std::string(what) + " must be a uint8 array (a payload)").c_str());
  }
  if (a.ndim() != 1) throw nb::value_error((std::string(what) + " must be 1-D").c_str());
  const std::size_t n = checked_elements(a, what);
  return gz::span<std::byte>(static_cast<std::byte*>(const_cast<void*>(static_cast<const void*>(a.data()))), n);
}

std::vector<bytes_view> payload_views(const std::vector<any_array>& payloads,
                                      std::vector<std::pair<int, std::string>>& placed) {
  std::vector<bytes_view> views;
  views.reserve(payloads.size());
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    const std::string what = "payloads[" + std::to_string(i) + "]";
    const auto b = bytes(payloads[i], what.c_str());
    placed.emplace_back(device_of(payloads[i], what), what);
    views.emplace_back(b.data(), b.size());
  }
  return views;
}

gz::quantize::compress_context context(std::uint64_t step, std::uint64_t tensor_id) { return {step, tensor_id}; }

/// The codec on CUDA arrays, or a TypeError saying how to get it.
const any_device_codec& device_codec(const any_codec& c, const std::string& what, int device) {
  if (c.device() == nullptr) {
    throw nb::type_error((what + " is on " + where(device) +
                          ", and this gradzip module was built without CUDA: reinstall with nvcc on the PATH "
                          "(pip install ./python -Ccmake.define.GRADZIP_PYTHON_CUDA=ON; docs/pytorch.md)")
                             .c_str());
  }
  return *c.device();
}

/// CUDA executors by device, each made on first use (its stream serves every caller's stream on
/// that device, ordered by events). Callers hold their object's lock.
class device_executors {
 public:
  device_executor& at(int device) {
#if GRADZIP_PYTHON_CUDA
    device_executor_ptr& e = by_device_[device];
    if (!e) e = make_device_executor(device);
    return *e;
#else
    // Unreachable: device_codec refuses CUDA arrays first in a build without CUDA.
    throw nb::type_error(("no CUDA executor for " + where(device) + ": built without CUDA").c_str());
#endif
  }

 private:
#if GRADZIP_PYTHON_CUDA
  std::map<int, device_executor_ptr> by_device_;
#endif
};

/// A codec and the executors whose scratch its calls use. An executor serves one thread at a
/// time, and calls run without the GIL (a DDP hook decodes on Gloo's threads while the autograd
/// thread compresses the next bucket): every call holds `busy`, taken after the GIL is released.
struct py_codec {
  py_codec(const std::string& spec, int threads) : spec(spec), exec(threads), codec(make_codec(parse_spec(spec))) {}
  std::string spec;
  gz::host exec;
  std::unique_ptr<any_codec> codec;
  device_executors gpus;
  std::mutex busy;
};

/// Error feedback for one tensor size, its residual on the CPU (device -1) or on a CUDA device.
struct py_feedback {
  py_feedback(py_codec& c, std::size_t n, int threads, int device)
      : n(n), max_bytes(c.codec->max_compressed_bytes(n)), exec(threads) {
    if (device < 0) {
      ef = c.codec->error_feedback(exec, n);
      exec.reserve(c.codec->workspace_bytes(exec, n));
    } else {
      // Zeroed on the executor's stream, which every later call of this feedback runs on.
      device_ef = device_codec(*c.codec, "the residual", device).error_feedback(gpus.at(device), n);
    }
  }
  int device() const { return ef ? -1 : device_ef->device(); }
  /// A TypeError unless `device` is the residual's.
  void expect_device(int device, const char* what) const {
    if (device != this->device()) {
      throw nb::type_error((std::string(what) + " is on " + where(device) + ", this feedback's residual on " +
                            where(this->device()))
                               .c_str());
    }
  }
  std::size_t n;
  std::size_t max_bytes;
  gz::host exec;
  std::unique_ptr<any_feedback> ef;                // CPU residual
  std::unique_ptr<any_device_feedback> device_ef;  // CUDA residual
  device_executors gpus;
  std::mutex busy;
};

nb::bytes to_bytes(const std::vector<std::byte>& v) { return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size()); }

bytes_view view_of(const nb::bytes& b) {
  return bytes_view(reinterpret_cast<const std::byte*>(b.c_str()), b.size());
}

struct py_powersgd {
  py_powersgd(const std::vector<std::vector<std::size_t>>& shapes, const gz::lowrank::powersgd_params& params, int threads)
      : exec(threads), ps(exec, shapes, params) {}
  gz::host exec;
  gz::lowrank::powersgd<float, gz::host> ps;
  std::mutex busy;
};

/// Runs f() with the GIL released, holding `busy` (taken after the release: see py_codec).
template <class F>
auto without_gil(std::mutex& busy, F&& f) {
  nb::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(busy);
  return f();
}

/// PowerSGD's factor: 0 (P) or 1 (Q), refused otherwise.
gz::lowrank::factor factor_of(int f) {
  if (f != 0 && f != 1) throw nb::value_error(("factor must be 0 (P) or 1 (Q), got " + std::to_string(f)).c_str());
  return static_cast<gz::lowrank::factor>(f);
}

}  // namespace

NB_MODULE(_gradzip, m) {
  m.doc() = "gradzip's host codecs (float32), behind gradzip's Python package";
  // DDP keeps its hook's state (and so codecs) alive until the interpreter is torn down.
  nb::set_leak_warnings(false);
  static nb::exception<gz::format_error> format_error(m, "FormatError", PyExc_ValueError);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const gz::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const gz::format_error& e) {
      PyErr_SetString(format_error.ptr(), e.what());
    } catch (const gz::error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  nb::class_<py_codec>(m, "Codec")
      .def(nb::init<const std::string&, int>(), nb::arg("spec"), nb::arg("threads") = 1)
      .def_ro("spec", &py_codec::spec)
      .def_prop_ro("cuda", [](const py_codec& c) { return c.codec->device() != nullptr; })
      .def("max_compressed_bytes", [](const py_codec& c, std::size_t n) { return c.codec->max_compressed_bytes(n); })
      .def_prop_ro("fixed_size", [](const py_codec& c) { return c.codec->fixed_size(); })
      .def("reserve",
           [](py_codec& c, std::size_t n) {
             std::lock_guard<std::mutex> lock(c.busy);
             c.exec.reserve(c.codec->workspace_bytes(c.exec, n));
           })
      .def(
          "compress",
          [](py_codec& c, const any_array& x, const out_array& out, std::uint64_t step, std::uint64_t tensor_id,
             std::uintptr_t stream) {
            const auto in = gz::span<const float>(floats(x, "tensor"));
            const auto o = bytes(out, "out");
            const int dev = one_device({{device_of(x, "tensor"), "tensor"}, {device_of(out, "out"), "out"}});
            if (dev < 0) {
              return without_gil(c.busy, [&] { return c.codec->compress(c.exec, in, o, context(step, tensor_id)); });
            }
            const any_device_codec& d = device_codec(*c.codec, "tensor", dev);
            return without_gil(c.busy,
                               [&] { return d.compress(c.gpus.at(dev), stream, in, o, context(step, tensor_id)); });
          },
          nb::arg("tensor"), nb::arg("out"), nb::arg("step") = 0, nb::arg("tensor_id") = 0, nb::arg("stream") = 0)
      .def(
          "decompress",
          [](py_codec& c, const any_array& payload, const out_array& out, std::uintptr_t stream) {
            const auto p = bytes(payload, "payload");
            const bytes_view pv(p.data(), p.size());
            const auto o = floats(out, "out");
            const int dev = one_device({{device_of(payload, "payload"), "payload"}, {device_of(out, "out"), "out"}});
            if (dev < 0) return without_gil(c.busy, [&] { c.codec->decompress(c.exec, pv, o); });
            const any_device_codec& d = device_codec(*c.codec, "payload", dev);
            without_gil(c.busy, [&] { d.decompress(c.gpus.at(dev), stream, pv, o); });
          },
          nb::arg("payload"), nb::arg("out"), nb::arg("stream") = 0)
      .def(
          "decompress_add",
          [](py_codec& c, const any_array& payload, const out_array& accum, float alpha, std::uintptr_t stream) {
            const auto p = bytes(payload, "payload");
            const bytes_view pv(p.data(), p.size());
            const auto o = floats(accum, "accum");
            const int dev =
                one_device({{device_of(payload, "payload"), "payload"}, {device_of(accum, "accum"), "accum"}});
            if (dev < 0) return without_gil(c.busy, [&] { c.codec->decompress_add(c.exec, pv, o, alpha); });
            const any_device_codec& d = device_codec(*c.codec, "payload", dev);
            without_gil(c.busy, [&] { d.decompress_add(c.gpus.at(dev), stream, pv, o, alpha); });
          },
          nb::arg("payload"), nb::arg("accum"), nb::arg("alpha") = 1.0f, nb::arg("stream") = 0)
      .def(
          "decompress_add_all",
          [](py_codec& c, const std::vector<any_array>& payloads, const out_array& accum, float alpha,
             std::uintptr_t stream) {
            std::vector<std::pair<int, std::string>> placed{{device_of(accum, "accum"), "accum"}};
            const std::vector<bytes_view> views = payload_views(payloads, placed);
            const gz::span<const bytes_view> all(views);
            const auto o = floats(accum, "accum");
            const int dev = one_device(placed);
            if (dev < 0) return without_gil(c.busy, [&] { c.codec->decompress_add_all(c.exec, all, o, alpha); });
            const any_device_codec& d = device_codec(*c.codec, "accum", dev);
            without_gil(c.busy, [&] { d.decompress_add_all(c.gpus.at(dev), stream, all, o, alpha); });
          },
          nb::arg("payloads"), nb::arg("accum"), nb::arg("alpha") = 1.0f, nb::arg("stream") = 0)
      .def(
          "decompress_all",
          [](py_codec& c, const std::vector<any_array>& payloads, const out_array& out, std::uintptr_t stream) {
            std::vector<std::pair<int, std::string>> placed{{device_of(out, "out"), "out"}};
            const std::vector<bytes_view> views = payload_views(payloads, placed);
            const gz::span<const bytes_view> all(views);
            const auto o = floats(out, "out");
            const int dev = one_device(placed);
            if (dev < 0) return without_gil(c.busy, [&] { c.codec->decompress_all(c.exec, all, o); });
            const any_device_codec& d = device_codec(*c.codec, "out", dev);
            without_gil(c.busy, [&] { d.decompress_all(c.gpus.at(dev), stream, all, o); });
          },
          nb::arg("payloads"), nb::arg("out"), nb::arg("stream") = 0)
      .def(
          "summable_section",
          [](const py_codec& c, std::size_t n) -> std::optional<std::tuple<std::size_t, std::size_t, std::string>> {
            const auto s = c.codec->summable(n);
            if (!s) return std::nullopt;
            return std::make_tuple(s->offset, s->bytes, s->dtype);
          },
          nb::arg("n"));

  nb::class_<py_feedback>(m, "ErrorFeedback")
      .def(nb::init<py_codec&, std::size_t, int, int>(), nb::arg("codec"), nb::arg("n"), nb::arg("threads") = 1,
           nb::arg("device") = -1)
      .def_prop_ro("size", [](const py_feedback& f) { return f.n; })
      .def_prop_ro("device", &py_feedback::device)
      .def("max_compressed_bytes", [](const py_feedback& f) { return f.max_bytes; })
      .def(
          "compress",
          [](py_feedback& f, const any_array& x, const out_array& out, std::uint64_t step, std::uint64_t tensor_id,
             std::uintptr_t stream) {
            const auto in = gz::span<const float>(floats(x, "tensor"));
            const auto o = bytes(out, "out");
            const int dev = one_device({{device_of(x, "tensor"), "tensor"}, {device_of(out, "out"), "out"}});
            f.expect_device(dev, "tensor");
            if (dev < 0) {
              return without_gil(f.busy, [&] { return f.ef->compress(f.exec, in, o, context(step, tensor_id)); });
            }
            return without_gil(f.busy, [&] {
              return f.device_ef->compress(f.gpus.at(dev), stream, in, o, context(step, tensor_id));
            });
          },
          nb::arg("tensor"), nb::arg("out"), nb::arg("step") = 0, nb::arg("tensor_id") = 0, nb::arg("stream") = 0)
      .def(
          "save",
          [](py_feedback& f, std::uintptr_t stream) {
            std::lock_guard<std::mutex> lock(f.busy);
            return to_bytes(f.ef ? f.ef->save(f.exec) : f.device_ef->save(f.gpus.at(f.device()), stream));
          },
          nb::arg("stream") = 0)
      .def(
          "restore",
          [](py_feedback& f, const nb::bytes& state, std::uintptr_t stream) {
            std::lock_guard<std::mutex> lock(f.busy);
            if (f.ef) return f.ef->restore(f.exec, view_of(state));
            f.device_ef->restore(f.gpus.at(f.device()), stream, view_of(state));
          },
          nb::arg("state"), nb::arg("stream") = 0);

  nb::class_<py_powersgd>(m, "PowerSGD")
      .def(
          "__init__",
          [](py_powersgd* self, const std::vector<std::vector<std::size_t>>& shapes, int rank, float min_compression_rate,
             float epsilon, bool warm_start, bool error_feedback, std::uint64_t seed, int threads) {
            gz::lowrank::powersgd_params p;
            p.rank = rank;
            p.min_compression_rate = min_compression_rate;
            p.epsilon = epsilon;
            p.warm_start = warm_start;
            p.error_feedback = error_feedback;
            p.seed = seed;
            new (self) py_powersgd(shapes, p, threads);
          },
          nb::arg("shapes"), nb::arg("rank") = 1, nb::arg("min_compression_rate") = 2.0f, nb::arg("epsilon") = 0.0f,
          nb::arg("warm_start") = true, nb::arg("error_feedback") = true, nb::arg("seed") = 0, nb::arg("threads") = 1)
      .def_prop_ro("size", [](const py_powersgd& s) { return s.ps.size(); })
      .def("payload_bytes",
           [](const py_powersgd& s, int f) { return s.ps.payload_bytes(factor_of(f)); })
      .def("factors_section",
           [](const py_powersgd& s, int f) {
             const auto fr = s.ps.frame_of(factor_of(f));
             return std::make_tuple(static_cast<std::size_t>(fr.values_offset()), static_cast<std::size_t>(fr.elements));
           })
      .def("dense_ranges",
           [](const py_powersgd& s) {
             std::vector<std::tuple<std::size_t, std::size_t>> out;
             for (const auto& t : s.ps.plan().tensors()) {
               if (!t.compressed()) out.emplace_back(t.offset, t.size());
             }
             return out;
           })
      .def(
          "compress_p",
          [](py_powersgd& s, const any_array& grad, const out_array& out, std::uint64_t step, std::uint64_t tensor_id) {
            const auto g = floats(grad, "grad");
            const auto o = bytes(out, "out");
            return without_gil(s.busy, [&] {
              return s.ps.compress_p(s.exec, gz::span<const float>(g.data(), g.size()), o,
                                     context(step, tensor_id));
            });
          },
          nb::arg("grad"), nb::arg("out"), nb::arg("step") = 0, nb::arg("tensor_id") = 0)
      .def(
          "compress_q",
          [](py_powersgd& s, const any_array& p_sum, const out_array& out) {
            const auto p = bytes(p_sum, "p_sum");
            const auto o = bytes(out, "out");
            return without_gil(
                s.busy, [&] { return s.ps.compress_q(s.exec, bytes_view(p.data(), p.size()), o); });
          },
          nb::arg("p_sum"), nb::arg("out"))
      .def(
          "decompress",
          [](py_powersgd& s, const any_array& q_sum, int ranks, const out_array& grad) {
            const auto q = bytes(q_sum, "q_sum");
            const auto g = floats(grad, "grad");
            return without_gil(
                s.busy, [&] { s.ps.decompress(s.exec, bytes_view(q.data(), q.size()), ranks, g); });
          },
          nb::arg("q_sum"), nb::arg("ranks"), nb::arg("grad"))
      .def("save",
           [](py_powersgd& s) {
             std::lock_guard<std::mutex> lock(s.busy);
             return to_bytes(s.ps.save(s.exec));
           })
      .def("restore", [](py_powersgd& s, const nb::bytes& state) {
        std::lock_guard<std::mutex> lock(s.busy);
        s.ps.restore(s.exec, view_of(state));
      });
}

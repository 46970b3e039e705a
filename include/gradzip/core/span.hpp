/**
 * @file span.hpp
 * @brief `gradzip::span<T>`: a pointer and a 64-bit length, usable in host and device code.
 *
 * It views memory that somebody else owns (host or device memory, according to the executor it
 * is given to). Sizes are `std::size_t`, 64 bits, so tensors above 2^31 elements work.
 *
 * @code
 * std::vector<float> g(n);
 * gradzip::span<const float> view(g);          // from any contiguous container
 * std::byte* ptr = nullptr;                    // e.g. a buffer your transport owns
 * gradzip::span<std::byte> out(ptr, 0);        // from a pointer and a length
 * // gradzip's functions deduce T from span<const T>, as std::span's users do: pass
 * // gradzip::span<const float>(g), not g, where T is a template parameter.
 * @endcode
 */
#pragma once

#include <cstddef>
#include <type_traits>

#include "gradzip/core/config.hpp"

namespace gradzip {

template <class T>
class span {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;

  GRADZIP_HOST_DEVICE constexpr span() noexcept : data_(nullptr), size_(0) {}
  GRADZIP_HOST_DEVICE constexpr span(T* data, std::size_t size) noexcept : data_(data), size_(size) {}

  /// From a contiguous container with data() and size() (std::vector, std::array, ...).
  template <class Container,
            class = std::enable_if_t<std::is_convertible_v<
                decltype(std::declval<Container&>().data()), T*>>>
  constexpr span(Container& c) noexcept : data_(c.data()), size_(c.size()) {}

  /// span<T> converts to span<const T>.
  template <class U, class = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
  GRADZIP_HOST_DEVICE constexpr span(const span<U>& other) noexcept
      : data_(other.data()), size_(other.size()) {}

  GRADZIP_HOST_DEVICE constexpr T* data() const noexcept { return data_; }
  GRADZIP_HOST_DEVICE constexpr std::size_t size() const noexcept { return size_; }
  GRADZIP_HOST_DEVICE constexpr std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  GRADZIP_HOST_DEVICE constexpr bool empty() const noexcept { return size_ == 0; }
  GRADZIP_HOST_DEVICE constexpr T& operator[](std::size_t i) const noexcept { return data_[i]; }
  GRADZIP_HOST_DEVICE constexpr T* begin() const noexcept { return data_; }
  GRADZIP_HOST_DEVICE constexpr T* end() const noexcept { return data_ + size_; }

  /// The `count` elements starting at `offset`; the caller guarantees they lie inside.
  GRADZIP_HOST_DEVICE constexpr span subspan(std::size_t offset, std::size_t count) const noexcept {
    return span(data_ + offset, count);
  }

 private:
  T* data_;
  std::size_t size_;
};

template <class Container>
span(Container&) -> span<std::remove_pointer_t<decltype(std::declval<Container&>().data())>>;

/// Views any span's memory as bytes.
template <class T>
span<const std::byte> as_bytes(span<T> s) noexcept {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size_bytes()};
}

template <class T, class = std::enable_if_t<!std::is_const_v<T>>>
span<std::byte> as_writable_bytes(span<T> s) noexcept {
  return {reinterpret_cast<std::byte*>(s.data()), s.size_bytes()};
}

}  // namespace gradzip

// Host tensors: a non-owning view (dtype, shape, pointer) and an owning, 64-byte-aligned buffer, which
// may instead borrow read-only memory that a shared owner keeps alive (an engine file's mapping, so
// loading never copies weights). Row-major and contiguous throughout; strided views exist only inside
// the backends.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ingot {

using Shape = std::vector<int64_t>;

inline int64_t numel(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
}
std::string shape_str(const Shape& s);

struct TensorView {
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;

  int64_t numel() const { return ingot::numel(shape); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data); }
};

class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, Shape shape);  // zero-filled
  // Read-only tensor over `data`, valid while `owner` lives; no copy is made.
  static HostTensor borrow(DType dtype, Shape shape, const void* data, std::shared_ptr<const void> owner);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return ingot::numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool borrowed() const { return owner_ != nullptr; }
  // Writable access; throws std::logic_error on a borrowed tensor, whose memory may be read-only.
  void* data() {
    if (owner_) refuse_write();
    return buf_.get();
  }
  const void* data() const { return owner_ ? borrowed_ : buf_.get(); }
  template <typename T>
  T* as() { return static_cast<T*>(data()); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data()); }
  TensorView view() const { return {dtype_, shape_, data()}; }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  DType dtype_ = DType::F32;
  Shape shape_;
  [[noreturn]] static void refuse_write();
  std::unique_ptr<void, Free> buf_;
  std::shared_ptr<const void> owner_;  // set only for borrowed tensors
  const void* borrowed_ = nullptr;
};

}  // namespace ingot

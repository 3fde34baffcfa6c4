#include "core/tensor.h"

#include <cstring>
#include <new>
#include <stdexcept>

namespace ingot {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

HostTensor::HostTensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  size_t bytes = nbytes();
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded ? rounded : 64);
  buf_.reset(p);
}

HostTensor HostTensor::borrow(DType dtype, Shape shape, const void* data, std::shared_ptr<const void> owner) {
  HostTensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.borrowed_ = data;
  t.owner_ = std::move(owner);
  return t;
}

void HostTensor::refuse_write() {
  throw std::logic_error("a borrowed (read-only) tensor was opened for writing");
}

}  // namespace ingot

// Tensor: a non-owning view (pointer, shape, dtype, device). Memory is owned by Buffers from the
// Allocator; models carve many views out of a few flat buffers (llm.c style), so a view is cheap
// to copy and never frees anything. A default-constructed Tensor is "absent" (optional inputs).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/check.h"
#include "core/dtype.h"

namespace llmt {

class Shape {
 public:
  static constexpr int kMaxDims = 6;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    LLMT_CHECK(dims.size() <= kMaxDims, "at most ", kMaxDims, " dims");
    for (int64_t d : dims) dims_[ndim_++] = d;
  }
  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[i < 0 ? i + ndim_ : i]; }
  // This shape with dim i set to n.
  Shape with_dim(int i, int64_t n) const {
    Shape s = *this;
    s.dims_[i < 0 ? i + ndim_ : i] = n;
    return s;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim_; ++i) n *= dims_[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (ndim_ != o.ndim_) return false;
    for (int i = 0; i < ndim_; ++i)
      if (dims_[i] != o.dims_[i]) return false;
    return true;
  }
  std::string str() const;

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

struct Tensor {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;
  Device device;

  Tensor() = default;
  Tensor(void* d, Shape s, DType t, Device dev = {}) : data(d), shape(s), dtype(t), device(dev) {}

  bool defined() const { return data != nullptr; }
  int64_t numel() const { return shape.numel(); }
  int64_t size(int i) const { return shape[i]; }
  int ndim() const { return shape.ndim(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }

  float* f32() const {
    LLMT_CHECK(dtype == DType::f32, "expected f32 tensor, got ", dtype_name(dtype));
    return static_cast<float*>(data);
  }
  int32_t* i32() const {
    LLMT_CHECK(dtype == DType::i32, "expected i32 tensor, got ", dtype_name(dtype));
    return static_cast<int32_t*>(data);
  }
  // Same memory, another shape with the same number of elements.
  Tensor view(Shape s) const {
    LLMT_CHECK(s.numel() == numel(), "view ", s.str(), " of ", shape.str(), " changes numel");
    return Tensor(data, s, dtype, device);
  }
  // Rows [begin, end) of dim 0 (contiguous).
  Tensor rows(int64_t begin, int64_t end) const;
};

// "(4, 64, 768)" and a one-line description for error messages.
std::string describe(const Tensor& t);

}  // namespace llmt

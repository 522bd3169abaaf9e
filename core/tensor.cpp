// Shape printing and row slicing for Tensor views.
#include "core/tensor.h"

#include <sstream>

namespace llmt {

std::string Shape::str() const {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < ndim_; ++i) os << (i ? ", " : "") << dims_[i];
  os << (ndim_ == 1 ? ",)" : ")");
  return os.str();
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  LLMT_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape[0], "rows [", begin, ", ",
             end, ") of ", shape.str());
  int64_t row = shape[0] == 0 ? 0 : numel() / shape[0];
  Shape s = shape;
  Shape out;
  switch (ndim()) {
    case 1:
      out = {end - begin};
      break;
    case 2:
      out = {end - begin, s[1]};
      break;
    case 3:
      out = {end - begin, s[1], s[2]};
      break;
    case 4:
      out = {end - begin, s[1], s[2], s[3]};
      break;
    default:
      LLMT_CHECK(false, "rows() supports up to 4 dims, got ", s.str());
  }
  return Tensor(static_cast<char*>(data) + begin * row * dtype_size(dtype), out, dtype, device);
}

std::string describe(const Tensor& t) {
  return detail::concat(dtype_name(t.dtype), t.shape.str(), "@", device_name(t.device.kind));
}

}  // namespace llmt

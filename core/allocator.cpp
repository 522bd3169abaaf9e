// CPU backend (64-byte aligned host memory), the meta device (address space only) and the
// accounting Allocator.
#include "core/allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "core/file_memory.h"

namespace llmt {

std::string_view category_name(MemCategory c) {
  switch (c) {
    case MemCategory::params:
      return "params";
    case MemCategory::grads:
      return "grads";
    case MemCategory::optimizer:
      return "optimizer";
    case MemCategory::activations:
      return "activations";
    case MemCategory::comm:
      return "comm";
    case MemCategory::other:
      return "other";
  }
  return "?";
}

namespace {
void* aligned_host(size_t bytes) {
  size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw Error(detail::concat("out of host memory allocating ", bytes, " bytes"));
  return p;
}

class CpuBackend final : public DeviceBackend {
 public:
  Device device() const override { return {DeviceKind::cpu, 0}; }
  void* allocate(size_t bytes) override { return aligned_host(bytes); }
  void deallocate(void* p) override { std::free(p); }
  void memset_zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void synchronize() override {}
};

// make_meta_backend (allocator.h).
class MetaBackend final : public DeviceBackend {
 public:
  explicit MetaBackend(bool reads_zero) : reads_zero_(reads_zero) {}
  ~MetaBackend() override {
    for (const auto& [p, bytes] : regions_) munmap(p, bytes);
  }
  Device device() const override { return {DeviceKind::cpu, 0}; }
  void* allocate(size_t bytes) override {
    const size_t n = std::max<size_t>(bytes, 1);
    void* p = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      throw Error(detail::concat("meta device: cannot reserve ", bytes, " bytes of address space"));
    const std::lock_guard<std::mutex> lock(mu_);
    regions_[p] = n;
    return p;
  }
  void deallocate(void* p) override {
    const std::lock_guard<std::mutex> lock(mu_);
    const auto it = regions_.find(p);
    if (it == regions_.end()) return;
    munmap(p, it->second);
    regions_.erase(it);
  }
  void memset_zero(void*, size_t) override {}
  void copy_to_host(void* dst, const void*, size_t bytes) override {
    if (!reads_zero_) throw Error("the meta device holds no data to copy to the host");
    std::memset(dst, 0, bytes);
  }
  void copy_from_host(void*, const void*, size_t) override {}
  void copy(void*, const void*, size_t) override {}
  void synchronize() override {}

 private:
  const bool reads_zero_;
  std::mutex mu_;
  std::map<void*, size_t> regions_;
};
}  // namespace

std::unique_ptr<DeviceBackend> make_meta_backend(bool reads_zero) {
  return std::make_unique<MetaBackend>(reads_zero);
}

void* DeviceBackend::allocate_host(size_t bytes) {
  return aligned_host(bytes);
}
void DeviceBackend::deallocate_host(void* p) {
  std::free(p);
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    backend_ = std::exchange(o.backend_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void HostBuffer::reserve(DeviceBackend& backend, size_t bytes) {
  if (backend_ == &backend && bytes_ >= bytes) return;
  reset();
  data_ = backend.allocate_host(bytes);
  backend_ = &backend;
  bytes_ = bytes;
}

void HostBuffer::reset() {
  if (data_) backend_->deallocate_host(data_);
  backend_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

std::unique_ptr<DeviceBackend> make_cpu_backend() {
  return std::make_unique<CpuBackend>();
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = o.owner_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    category_ = o.category_;
    in_file_ = o.in_file_;
    o.owner_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (owner_ && data_) owner_->release(data_, bytes_, category_, in_file_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
  in_file_ = false;
}

Tensor Buffer::tensor(Shape s, DType t, size_t offset) const {
  size_t need = offset + static_cast<size_t>(s.numel()) * dtype_size(t);
  LLMT_CHECK(need <= bytes_, "view ", s.str(), " at offset ", offset, " needs ", need,
             " bytes, buffer has ", bytes_);
  return Tensor(static_cast<char*>(data_) + offset, s, t, owner_ ? owner_->device() : Device{});
}

Buffer Allocator::allocate(size_t bytes, MemCategory category, Offload offload) {
  Buffer b;
  b.owner_ = this;
  const int c = static_cast<int>(category);
  if (store_ && ((offload == Offload::with_optimizer && offload_optimizer_) ||
                 (offload == Offload::with_params && offload_params_))) {
    b.data_ = store_->map(bytes, detail::concat("offloaded ", category_name(category)));  // zeros
    b.bytes_ = bytes;
    b.category_ = category;
    b.in_file_ = true;
    offloaded_live_[c] += static_cast<int64_t>(bytes);
    stats_.offloaded[c] = std::max(stats_.offloaded[c], offloaded_live_[c]);
    return b;
  }
  b.data_ = backend_.allocate(bytes);
  b.bytes_ = bytes;
  b.category_ = category;
  backend_.memset_zero(b.data_, bytes);
  stats_.live[c] += static_cast<int64_t>(bytes);
  stats_.peak[c] = std::max(stats_.peak[c], stats_.live[c]);
  stats_.live_total += static_cast<int64_t>(bytes);
  stats_.peak_total = std::max(stats_.peak_total, stats_.live_total);
  return b;
}

void Allocator::set_offload(FileStore* store, bool optimizer, bool params) {
  store_ = store;
  offload_optimizer_ = store && optimizer;
  offload_params_ = store && params;
}

void Allocator::release(void* p, size_t bytes, MemCategory category, bool in_file) {
  if (in_file) {
    store_->unmap(p);
    offloaded_live_[static_cast<int>(category)] -= static_cast<int64_t>(bytes);
    return;
  }
  backend_.deallocate(p);
  stats_.live[static_cast<int>(category)] -= static_cast<int64_t>(bytes);
  stats_.live_total -= static_cast<int64_t>(bytes);
}

void Allocator::reset_peaks() {
  stats_.peak = stats_.live;
  stats_.peak_total = stats_.live_total;
  stats_.offloaded = offloaded_live_;
}

}  // namespace llmt

// Device memory with accounting. Every allocation names a category (params, grads, optimizer,
// activations, comm, other); the Allocator keeps live and peak bytes per category so `plan`
// estimates and ZeRO savings can be checked against what a run really used.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "core/tensor.h"

namespace llmt {

enum class MemCategory : uint8_t { params, grads, optimizer, activations, comm, other };
constexpr int kNumMemCategories = 6;
std::string_view category_name(MemCategory c);

// Which [offload] setting may move a buffer into the allocator's FileStore
// (Allocator::set_offload): the optimizer's state (and master weights kept apart from the model's),
// or ZeRO-3's parameter shards.
enum class Offload : uint8_t { never, with_optimizer, with_params };

class FileStore;

// Raw memory and copies of one device. The CPU backend is always present; the CUDA backend
// exists only in builds with LLMTRAIN_CUDA (make_device_backend says "not built in" otherwise).
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual Device device() const = 0;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;
  virtual void memset_zero(void* p, size_t bytes) = 0;
  // Copies between host and this device (either side may be host memory).
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;
  // Host memory for staging copies to and from this device (use HostBuffer). The CUDA backend
  // page-locks it (cudaHostAlloc), so copies run at full PCIe speed instead of going through the
  // driver's pageable bounce buffer; the default is plain 64-byte aligned memory.
  virtual void* allocate_host(size_t bytes);
  virtual void deallocate_host(void* p);
};

std::unique_ptr<DeviceBackend> make_cpu_backend();
// A device that holds no data: each allocation is address space reserved without access
// (PROT_NONE, no memory committed), so an Allocator over it lays out and counts every buffer as
// on a real device while any kernel that touched one would fault at once. Copies to it are
// dropped; reading from it is an error, or with `reads_zero` gives zeros (a model running a step
// on it to count its ops' bytes reads its loss and counts). `plan` builds a rank's model on it to
// count that model's own buffers (no byte formula kept beside the code that allocates). Reports
// the CPU as device.
std::unique_ptr<DeviceBackend> make_meta_backend(bool reads_zero = false);
// Throws llmt::Error naming the reason when CUDA is not built in or no GPU is usable.
std::unique_ptr<DeviceBackend> make_device_backend(Device d);
bool cuda_built_in();
// The device of a `train.device` setting for the rank with this node-local index: "cpu"; "cuda"
// (GPU local_rank, even where none is usable: make_device_backend then says why); "auto": the
// GPU when CUDA is built in and GPUs are visible, else the CPU.
Device select_device(std::string_view setting, int local_rank);
// Sets CUDA_MODULE_LOADING=EAGER for this process unless the environment already sets it (in
// builds with CUDA; nothing otherwise). Effective only before CUDA's first call (select_device
// "auto" is one): the first launch of a kernel under lazy loading may synchronize the context,
// which can deadlock a ZB-V pipeline's transfers (docs/gpu.md).
void request_eager_module_loading();
// Free bytes on GPU `d` (cudaMemGetInfo), for the check before allocation; -1 when unknown (a
// CPU device, CUDA not built in, no usable GPU).
double gpu_free_bytes(Device d);
// The backends this binary has, for --version: "cpu (OpenMP + BLAS), cuda (CUDA runtime ...)".
std::string built_in_backends();

// live/peak: device memory. offloaded: the bytes of each category in the FileStore's files (not in
// live or peak), at their peak.
struct MemStats {
  std::array<int64_t, kNumMemCategories> live{};
  std::array<int64_t, kNumMemCategories> peak{};
  int64_t live_total = 0;
  int64_t peak_total = 0;
  std::array<int64_t, kNumMemCategories> offloaded{};
};

class Allocator;

// Host staging memory of one DeviceBackend (DeviceBackend::allocate_host: pinned on a GPU),
// owned; move-only. Not counted by the Allocator, which accounts device memory.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(HostBuffer&& o) noexcept { *this = std::move(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { reset(); }

  // Makes this at least `bytes` of `backend`'s host memory: kept when it already is (so a buffer
  // reused from one copy to the next is allocated and pinned once), else replaced (contents lost).
  void reserve(DeviceBackend& backend, size_t bytes);
  void reset();
  void* data() const { return data_; }
  float* f32() const { return static_cast<float*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  DeviceBackend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Owns one allocation; returns it to the Allocator on destruction. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset();
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // A view of this buffer starting at byte `offset`.
  Tensor tensor(Shape s, DType t, size_t offset = 0) const;

 private:
  friend class Allocator;
  Allocator* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemCategory category_ = MemCategory::other;
  bool in_file_ = false;  // in the allocator's FileStore
};

class Allocator {
 public:
  explicit Allocator(DeviceBackend& backend) : backend_(backend) {}
  // Zero-filled allocation of `bytes`, counted under `category`; in the FileStore's files instead
  // (counted as offloaded) when `offload` names a setting set_offload turned on.
  Buffer allocate(size_t bytes, MemCategory category, Offload offload = Offload::never);
  // Where buffers allocated with Offload::with_optimizer (when `optimizer`) and with_params (when
  // `params`) go from now on; `store` outlives the allocator's buffers.
  void set_offload(FileStore* store, bool optimizer, bool params);
  FileStore* file_store() const { return store_; }
  // One buffer holding one tensor.
  Buffer allocate_tensor(Shape s, DType t, MemCategory category) {
    return allocate(static_cast<size_t>(s.numel()) * dtype_size(t), category);
  }
  const MemStats& stats() const { return stats_; }
  void reset_peaks();
  DeviceBackend& backend() const { return backend_; }
  Device device() const { return backend_.device(); }

 private:
  friend class Buffer;
  void release(void* p, size_t bytes, MemCategory category, bool in_file);
  DeviceBackend& backend_;
  MemStats stats_;
  FileStore* store_ = nullptr;
  bool offload_optimizer_ = false, offload_params_ = false;
  std::array<int64_t, kNumMemCategories> offloaded_live_{};
};

}  // namespace llmt

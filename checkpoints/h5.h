// Thin RAII over the HDF5 C API for the checkpoint files (private to checkpoints/: no engine
// header includes <hdf5.h>). Errors throw llmt::Error with what was being done and the innermost
// messages of HDF5's error stack (e.g. "data error detected by fletcher32 checksum").
#pragma once

#include <hdf5.h>

#include <string>
#include <utility>
#include <vector>

#include "core/check.h"

namespace llmt::ckpt::h5 {

// An HDF5 identifier closed with its own close function.
class Id {
 public:
  Id() = default;
  Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Id(Id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  ~Id() { reset(); }
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now; returns false if HDF5 reported an error (a failed flush).
  bool reset() {
    bool ok = true;
    if (id_ >= 0 && close_) ok = close_(id_) >= 0;
    id_ = H5I_INVALID_HID;
    return ok;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// Turns off HDF5's printing of error stacks (we report them in exceptions).
void quiet();
// The HDF5 error stack of the current thread, innermost first, as one line ("" when empty).
std::string error_stack();
// Throws Error("<what>: <error stack>") if `status` < 0.
void check(herr_t status, const std::string& what);
// Returns id, or throws as check() if it is negative.
Id checked(hid_t id, herr_t (*close)(hid_t), const std::string& what);

Id open_file(const std::string& path, bool write);
Id create_file(const std::string& path);
Id open_dataset(hid_t file, const std::string& name, const std::string& where);
// A dataspace of `dims`.
Id simple_space(const std::vector<int64_t>& dims);
// The dims of a dataset's dataspace.
std::vector<int64_t> dataset_dims(hid_t dset);
// Selects start/count in `space` (a regular hyperslab).
void select(hid_t space, const std::vector<int64_t>& start, const std::vector<int64_t>& count);

// Scalar and string attributes on an object.
void write_attr(hid_t obj, const char* name, int64_t v);
void write_attr(hid_t obj, const char* name, double v);
void write_attr(hid_t obj, const char* name, const std::string& v);
void write_attr(hid_t obj, const char* name, const std::vector<int64_t>& v);
bool has_attr(hid_t obj, const char* name);
int64_t read_attr_int(hid_t obj, const char* name, const std::string& where);
double read_attr_double(hid_t obj, const char* name, const std::string& where);
std::string read_attr_string(hid_t obj, const char* name, const std::string& where);
std::vector<int64_t> read_attr_ints(hid_t obj, const char* name, const std::string& where);

// Flushes a closed file (or a directory) to disk: open + fsync.
void fsync_path(const std::string& path);

}  // namespace llmt::ckpt::h5

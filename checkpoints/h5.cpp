#include "checkpoints/h5.h"

#include <fcntl.h>
#include <unistd.h>

namespace llmt::ckpt::h5 {

void quiet() {
  // No exit-time cleanup: after a failed H5Fclose (a full disk) the file stays in the library's
  // open list, and its cleanup at exit flushed it again and crashed (exit 139) after the error
  // had been reported. Every file is closed explicitly (h5::Id) on the paths that succeed.
  // Effective only before the library's first use, which this is on every path.
  static const bool once = [] {
    H5dont_atexit();
    return true;
  }();
  (void)once;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

namespace {
herr_t collect(unsigned n, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  (void)n;
  if (e->desc && *e->desc) out->push_back(e->desc);
  return 0;
}
}  // namespace

std::string error_stack() {
  std::vector<std::string> msgs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect, &msgs);
  H5Eclear2(H5E_DEFAULT);
  // A failed system call buried in the stack ("... errno = 28, error message = 'No space left on
  // device' ...") is the cause a user needs: say that alone.
  for (const std::string& m : msgs) {
    const size_t e = m.find("error message = '");
    if (e == std::string::npos) continue;
    const size_t from = e + 17, to = m.find('\'', from);
    const size_t no = m.find("errno = ");
    return m.substr(from, to == std::string::npos ? std::string::npos : to - from) +
           (no == std::string::npos ? "" : " (" + m.substr(no, m.find(',', no) - no) + ")");
  }
  std::string s;
  for (const std::string& m : msgs) {
    if (s.find(m) != std::string::npos) continue;
    s += (s.empty() ? "" : "; ") + m;
  }
  return s;
}

void check(herr_t status, const std::string& what) {
  if (status >= 0) return;
  const std::string stack = error_stack();
  throw Error(what + (stack.empty() ? "" : ": " + stack));
}

Id checked(hid_t id, herr_t (*close)(hid_t), const std::string& what) {
  if (id < 0) check(-1, what);
  return Id(id, close);
}

Id open_file(const std::string& path, bool write) {
  return checked(H5Fopen(path.c_str(), write ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT),
                 H5Fclose, "cannot open HDF5 file " + path);
}

Id create_file(const std::string& path) {
  return checked(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose,
                 "cannot create HDF5 file " + path);
}

Id open_dataset(hid_t file, const std::string& name, const std::string& where) {
  return checked(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose,
                 where + ": cannot open dataset " + name);
}

Id simple_space(const std::vector<int64_t>& dims) {
  std::vector<hsize_t> d(dims.begin(), dims.end());
  return checked(H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr), H5Sclose,
                 "H5Screate_simple");
}

std::vector<int64_t> dataset_dims(hid_t dset) {
  Id space = checked(H5Dget_space(dset), H5Sclose, "H5Dget_space");
  const int n = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> d(static_cast<size_t>(std::max(n, 0)));
  H5Sget_simple_extent_dims(space, d.data(), nullptr);
  return {d.begin(), d.end()};
}

void select(hid_t space, const std::vector<int64_t>& start, const std::vector<int64_t>& count) {
  std::vector<hsize_t> s(start.begin(), start.end()), c(count.begin(), count.end());
  check(H5Sselect_hyperslab(space, H5S_SELECT_SET, s.data(), nullptr, c.data(), nullptr),
        "H5Sselect_hyperslab");
}

namespace {
void write_attr_raw(hid_t obj, const char* name, hid_t type, hid_t space, const void* data) {
  Id a = checked(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                 std::string("cannot create attribute ") + name);
  check(H5Awrite(a, type, data), std::string("cannot write attribute ") + name);
}
Id open_attr(hid_t obj, const char* name, const std::string& where) {
  return checked(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose, where + ": missing attribute " + name);
}
}  // namespace

void write_attr(hid_t obj, const char* name, int64_t v) {
  Id space = checked(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  write_attr_raw(obj, name, H5T_NATIVE_INT64, space, &v);
}

void write_attr(hid_t obj, const char* name, double v) {
  Id space = checked(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  write_attr_raw(obj, name, H5T_NATIVE_DOUBLE, space, &v);
}

void write_attr(hid_t obj, const char* name, const std::vector<int64_t>& v) {
  Id space = simple_space({static_cast<int64_t>(v.size())});
  write_attr_raw(obj, name, H5T_NATIVE_INT64, space, v.data());
}

void write_attr(hid_t obj, const char* name, const std::string& v) {
  // A variable-length UTF-8 string, which h5py reads as str.
  Id type = checked(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy");
  check(H5Tset_size(type, H5T_VARIABLE), "H5Tset_size");
  check(H5Tset_cset(type, H5T_CSET_UTF8), "H5Tset_cset");
  Id space = checked(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  const char* p = v.c_str();
  write_attr_raw(obj, name, type, space, &p);
}

bool has_attr(hid_t obj, const char* name) {
  return H5Aexists(obj, name) > 0;
}

int64_t read_attr_int(hid_t obj, const char* name, const std::string& where) {
  Id a = open_attr(obj, name, where);
  int64_t v = 0;
  check(H5Aread(a, H5T_NATIVE_INT64, &v), where + ": cannot read attribute " + name);
  return v;
}

double read_attr_double(hid_t obj, const char* name, const std::string& where) {
  Id a = open_attr(obj, name, where);
  double v = 0;
  check(H5Aread(a, H5T_NATIVE_DOUBLE, &v), where + ": cannot read attribute " + name);
  return v;
}

std::vector<int64_t> read_attr_ints(hid_t obj, const char* name, const std::string& where) {
  Id a = open_attr(obj, name, where);
  Id space = checked(H5Aget_space(a), H5Sclose, "H5Aget_space");
  std::vector<int64_t> v(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
  check(H5Aread(a, H5T_NATIVE_INT64, v.data()), where + ": cannot read attribute " + name);
  return v;
}

std::string read_attr_string(hid_t obj, const char* name, const std::string& where) {
  Id a = open_attr(obj, name, where);
  Id type = checked(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy");
  check(H5Tset_size(type, H5T_VARIABLE), "H5Tset_size");
  check(H5Tset_cset(type, H5T_CSET_UTF8), "H5Tset_cset");
  char* p = nullptr;
  check(H5Aread(a, type, &p), where + ": cannot read attribute " + name);
  std::string s = p ? p : "";
  H5free_memory(p);
  return s;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error("cannot open " + path + " to sync it to disk");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error("fsync of " + path + " failed");
}

}  // namespace llmt::ckpt::h5

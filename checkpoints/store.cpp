#include "checkpoints/store.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "checkpoints/h5.h"

namespace llmt::ckpt {

namespace fs = std::filesystem;

WriteLayout write_layout(const RunState& s) {
  return {s.mesh,
          static_cast<int>(s.virtual_stages),
          s.pp_layers,
          static_cast<int>(s.ep),
          s.zero_shard_group,
          s.pp_v_shape};
}

std::string layout_text(const RunState& s) {
  return detail::concat(
      "tp=", s.mesh.size(Axis::tp), " cp=", s.mesh.size(Axis::cp), " dp=", s.mesh.size(Axis::dp),
      " pp=", s.mesh.size(Axis::pp), s.pp_v_shape ? " pp_stages=v" : "",
      s.ep > 1 ? detail::concat(" ep=", s.ep) : std::string(), " zero_stage=", s.zero_stage,
      s.zero_shard_group > 0 ? detail::concat(" zero_shard_group=", s.zero_shard_group)
                             : std::string(),
      " sequence_parallel=", s.sequence_parallel ? "true" : "false");
}

namespace {

// Link creation that makes missing parent groups ("model/" of "model/wte.weight").
h5::Id parents_lcpl() {
  h5::Id lcpl = h5::checked(H5Pcreate(H5P_LINK_CREATE), H5Pclose, "H5Pcreate");
  h5::check(H5Pset_create_intermediate_group(lcpl, 1), "H5Pset_create_intermediate_group");
  return lcpl;
}

constexpr int64_t kChunkElems = int64_t{1} << 20;

}  // namespace

// ---- writing ----

struct ShardFileWriter::Impl {
  h5::Id file, lcpl;
};

ShardFileWriter::ShardFileWriter(const std::string& path, int rank, int64_t step)
    : path_(path), impl_(std::make_unique<Impl>()) {
  h5::quiet();
  impl_->file = h5::create_file(path);
  impl_->lcpl = parents_lcpl();
  h5::write_attr(impl_->file, "format", std::string(kFormat) + "-shard");
  h5::write_attr(impl_->file, "version", kVersion);
  h5::write_attr(impl_->file, "rank", static_cast<int64_t>(rank));
  h5::write_attr(impl_->file, "step", step);
}

ShardFileWriter::~ShardFileWriter() = default;

void ShardFileWriter::write(const std::string& dataset, const Box& box, const float* data) {
  const std::string where = path_ + ": dataset " + dataset;
  h5::Id space = h5::simple_space(box.count);
  h5::Id dcpl = h5::checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate");
  // Chunks of whole rows (trailing dims whole), at most kChunkElems elements when rows allow.
  std::vector<hsize_t> chunk(box.count.begin(), box.count.end());
  const int64_t row_numel = box.numel() / std::max<int64_t>(1, box.count[0]);
  chunk[0] = static_cast<hsize_t>(
      std::clamp<int64_t>(kChunkElems / std::max<int64_t>(1, row_numel), 1, box.count[0]));
  h5::check(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()), where);
  h5::check(H5Pset_fletcher32(dcpl), where);
  h5::Id d = h5::checked(H5Dcreate2(impl_->file, dataset.c_str(), H5T_IEEE_F32LE, space,
                                    impl_->lcpl, dcpl, H5P_DEFAULT),
                         H5Dclose, "cannot create " + where);
  h5::check(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
            "cannot write " + where);
  h5::write_attr(d, "offset", box.start);
  h5::write_attr(d, kChecksumAttr, box_checksum(data, box.numel()));
  bytes_ += box.numel() * 4;
}

void ShardFileWriter::close() {
  impl_->lcpl.reset();
  if (!impl_->file.reset())
    throw Error("closing checkpoint file " + path_ + " failed: " + h5::error_stack());
  h5::fsync_path(path_);
}

void write_index(const std::string& dir, const RunState& s,
                 const std::vector<IndexTensor>& tensors) {
  h5::quiet();
  const std::string path = (fs::path(dir) / kIndexFile).string();
  {
    h5::Id file = h5::create_file(path);
    h5::write_attr(file, "format", std::string(kFormat));
    h5::write_attr(file, "version", kVersion);
    h5::write_attr(file, "step", s.step);
    h5::write_attr(file, "updates", s.updates);
    h5::write_attr(file, "consumed_samples", s.consumed_samples);
    h5::write_attr(file, "loss_scale", s.loss_scale);
    h5::write_attr(file, "loss_scale_clean_steps", s.loss_scale_clean_steps);
    h5::write_attr(file, "seed", s.seed);
    h5::write_attr(file, "config", s.config);
    h5::write_attr(file, "mesh", std::vector<int64_t>(s.mesh.degree.begin(), s.mesh.degree.end()));
    h5::write_attr(file, "zero_stage", s.zero_stage);
    h5::write_attr(file, "sequence_parallel", static_cast<int64_t>(s.sequence_parallel));
    h5::write_attr(file, "virtual_stages", s.virtual_stages);
    if (!s.pp_layers.empty()) h5::write_attr(file, "pp_layers", s.pp_layers);
    if (s.pp_v_shape) h5::write_attr(file, "pp_v_shape", int64_t{1});
    if (s.ep > 1) h5::write_attr(file, "ep", s.ep);
    if (s.zero_shard_group > 0) h5::write_attr(file, "zero_shard_group", s.zero_shard_group);
    h5::write_attr(file, "layout", layout_text(s));
    h5::write_attr(file, "state_xxh64", state_checksum(s));
    h5::Id lcpl = parents_lcpl();
    for (size_t t = 0; t < tensors.size(); ++t) {
      const IndexTensor& it = tensors[t];
      h5::Id vspace = h5::simple_space(it.shape);
      h5::Id dcpl = h5::checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate");
      // Elements no mapping covers read as NaN, never as a plausible zero.
      const float nan = std::numeric_limits<float>::quiet_NaN();
      h5::check(H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &nan), "H5Pset_fill_value");
      for (const Mapping& m : it.mappings) {
        h5::Id sel = h5::simple_space(it.shape);
        h5::select(sel, m.dest.start, m.dest.count);
        h5::Id src = h5::simple_space(m.dest.count);
        h5::check(H5Pset_virtual(dcpl, sel, m.file.c_str(), m.dataset.c_str(), src),
                  path + ": mapping " + m.file + ":" + m.dataset);
      }
      h5::Id d = h5::checked(
          H5Dcreate2(file, it.path.c_str(), H5T_IEEE_F32LE, vspace, lcpl, dcpl, H5P_DEFAULT),
          H5Dclose, path + ": cannot create virtual dataset " + it.path);
      h5::write_attr(d, "index", static_cast<int64_t>(t));
    }
    if (!file.reset()) throw Error("closing " + path + " failed: " + h5::error_stack());
  }
  h5::fsync_path(path);
}

// ---- reading ----

struct Checkpoint::Files {
  std::map<std::string, h5::Id> open;
  std::set<std::string> checked;    // "file/dataset" whose checksum matched
  std::set<std::string> with_step;  // open files that carry a step (their boxes a checksum)
};

int64_t state_checksum(const RunState& s) {
  uint64_t bits = 0;
  std::memcpy(&bits, &s.loss_scale, sizeof bits);
  std::string text = detail::concat(s.step, ' ', s.updates, ' ', s.consumed_samples, ' ', bits, ' ',
                                    s.loss_scale_clean_steps, ' ', s.seed, ' ', s.virtual_stages,
                                    ' ', s.zero_stage, ' ', s.sequence_parallel ? 1 : 0, ' ', s.ep);
  for (int d : s.mesh.degree) text += detail::concat(" m", d);
  for (int64_t l : s.pp_layers) text += detail::concat(" l", l);
  // (Only when set: the checksums of checkpoints written before the key still match.)
  if (s.zero_shard_group > 0) text += detail::concat(" z", s.zero_shard_group);
  if (s.pp_v_shape) text += " v";
  text += '\n' + s.config;
  const XXH64_hash_t h = XXH64(text.data(), text.size(), 0);
  int64_t out;
  std::memcpy(&out, &h, sizeof out);
  return out;
}

int64_t box_checksum(const float* data, int64_t numel) {
  static_assert(sizeof(float) == 4);
  const XXH64_hash_t h = XXH64(data, static_cast<size_t>(numel) * 4, 0);
  int64_t out;
  std::memcpy(&out, &h, sizeof out);
  return out;
}

namespace {

struct VisitState {
  std::vector<std::string> datasets;
};

// Values no run writes: refused before anything trusts them (a checksum catches edits within
// range).
void check_run_state(const RunState& s, const std::string& where) {
  std::vector<std::string> bad;
  if (s.step < 0) bad.push_back(detail::concat("step ", s.step, " < 0"));
  if (s.updates < 0 || s.updates > s.step)
    bad.push_back(detail::concat("updates ", s.updates, " outside [0, step ", s.step, "]"));
  if (s.consumed_samples < 0)
    bad.push_back(detail::concat("consumed_samples ", s.consumed_samples, " < 0"));
  if (!(s.loss_scale > 0) || !std::isfinite(s.loss_scale))
    bad.push_back(detail::concat("loss_scale ", s.loss_scale, " is not a positive number"));
  if (s.loss_scale_clean_steps < 0)
    bad.push_back(detail::concat("loss_scale_clean_steps ", s.loss_scale_clean_steps, " < 0"));
  int64_t world = 1;
  for (int a = 0; a < kNumAxes; ++a) {
    const int d = s.mesh.degree[a];
    if (d < 1 || d > (1 << 20))
      bad.push_back(detail::concat("mesh degree ", d, " outside [1, 2^20]"));
    world *= std::max(1, d);
  }
  if (world > (int64_t{1} << 24)) bad.push_back(detail::concat("mesh of ", world, " ranks"));
  if (s.zero_stage < 0 || s.zero_stage > 3)
    bad.push_back(detail::concat("zero_stage ", s.zero_stage));
  if (s.virtual_stages < 1 || s.ep < 1)
    bad.push_back(detail::concat("virtual_stages ", s.virtual_stages, ", ep ", s.ep));
  if (s.pp_v_shape && s.virtual_stages != 2)
    bad.push_back(detail::concat("pp_v_shape with virtual_stages ", s.virtual_stages));
  const int dp = s.mesh.degree[static_cast<int>(Axis::dp)];
  if (s.zero_shard_group < 0 ||
      (s.zero_shard_group > 0 && (dp < 1 || dp % s.zero_shard_group != 0 || s.zero_stage < 1)))
    bad.push_back(detail::concat("zero_shard_group ", s.zero_shard_group, " (dp ", dp,
                                 ", zero_stage ", s.zero_stage, ")"));
  if (bad.empty()) return;
  std::string msg = where + ": run-state attributes no run writes:";
  for (const std::string& b : bad) msg += " " + b + ";";
  msg.back() = ' ';
  throw Error(msg + "(the index is corrupt or was edited)");
}

herr_t visit_link(hid_t group, const char* name, const H5L_info_t* info, void* data) {
  (void)info;
  H5O_info_t oinfo;
#if H5_VERSION_GE(1, 12, 0)
  if (H5Oget_info_by_name3(group, name, &oinfo, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return -1;
#else
  if (H5Oget_info_by_name2(group, name, &oinfo, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return -1;
#endif
  if (oinfo.type == H5O_TYPE_DATASET) static_cast<VisitState*>(data)->datasets.push_back(name);
  return 0;
}

std::string read_name(ssize_t (*get)(hid_t, size_t, char*, size_t), hid_t dcpl, size_t i) {
  const ssize_t n = get(dcpl, i, nullptr, 0);
  if (n < 0) h5::check(-1, "reading a virtual mapping");
  std::string s(static_cast<size_t>(n) + 1, '\0');
  get(dcpl, i, s.data(), s.size());
  s.resize(static_cast<size_t>(n));
  return s;
}

}  // namespace

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir), files_(std::make_unique<Files>()) {
  h5::quiet();
  const std::string path = (fs::path(dir) / kIndexFile).string();
  if (!fs::is_directory(dir)) throw Error("checkpoint " + dir + " does not exist");
  if (!fs::exists(path))
    throw Error("checkpoint " + dir + " is incomplete: it has no " + kIndexFile);
  // Nothing reaches the HDF5 parser before the manifest vouches for it.
  manifest_ = read_manifest(dir);
  if (manifest_) check_file(dir, *manifest_, kIndexFile);
  h5::Id file = h5::open_file(path, false);
  const std::string where = "checkpoint index " + path;
  const std::string format = h5::read_attr_string(file, "format", where);
  if (format != kFormat)
    throw Error(where + ": attribute format is \"" + format + "\", expected \"" + kFormat + "\"");
  const int64_t version = h5::read_attr_int(file, "version", where);
  if (version != kVersion)
    throw Error(detail::concat(where, ": format version ", version, "; this build reads version ",
                               kVersion));
  RunState& s = state_;
  s.step = h5::read_attr_int(file, "step", where);
  s.updates = h5::read_attr_int(file, "updates", where);
  s.consumed_samples = h5::read_attr_int(file, "consumed_samples", where);
  s.loss_scale = h5::read_attr_double(file, "loss_scale", where);
  s.loss_scale_clean_steps = h5::read_attr_int(file, "loss_scale_clean_steps", where);
  s.seed = h5::read_attr_int(file, "seed", where);
  s.config = h5::read_attr_string(file, "config", where);
  const std::vector<int64_t> mesh = h5::read_attr_ints(file, "mesh", where);
  if (mesh.size() != kNumAxes) throw Error(where + ": attribute mesh must have 4 entries");
  for (int a = 0; a < kNumAxes; ++a) s.mesh.degree[a] = static_cast<int>(mesh[a]);
  s.zero_stage = h5::read_attr_int(file, "zero_stage", where);
  s.sequence_parallel = h5::read_attr_int(file, "sequence_parallel", where) != 0;
  s.virtual_stages = h5::read_attr_int(file, "virtual_stages", where);
  if (h5::has_attr(file, "pp_layers")) s.pp_layers = h5::read_attr_ints(file, "pp_layers", where);
  if (h5::has_attr(file, "pp_v_shape"))
    s.pp_v_shape = h5::read_attr_int(file, "pp_v_shape", where) != 0;
  if (h5::has_attr(file, "ep")) s.ep = h5::read_attr_int(file, "ep", where);
  if (h5::has_attr(file, "zero_shard_group"))
    s.zero_shard_group = h5::read_attr_int(file, "zero_shard_group", where);
  check_run_state(s, where);
  if (manifest_ && manifest_->step != s.step)
    throw Error(detail::concat(where, ": step ", s.step, ", the manifest's ", manifest_->step,
                               ": the index and the manifest are of different checkpoints"));
  // Written since the run state carries a checksum; older checkpoints have none to check.
  if (h5::has_attr(file, "state_xxh64") &&
      h5::read_attr_int(file, "state_xxh64", where) != state_checksum(s))
    throw Error(detail::concat(
        where, ": the run-state attributes (step ", s.step, ", updates ", s.updates,
        ", consumed_samples ", s.consumed_samples,
        ", mesh, config, ...) do not match their "
        "checksum state_xxh64: they were edited or are corrupt, so the step, schedule and data "
        "position to resume from cannot be trusted"));

  VisitState visit;
  h5::check(H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, visit_link, &visit),
            where + ": listing datasets");
  std::vector<std::pair<int64_t, IndexTensor>> found;
  for (const std::string& name : visit.datasets) {
    h5::Id d = h5::open_dataset(file, name, where);
    h5::Id dcpl = h5::checked(H5Dget_create_plist(d), H5Pclose, "H5Dget_create_plist");
    if (H5Pget_layout(dcpl) != H5D_VIRTUAL)
      throw Error(where + ": dataset " + name + " is not a virtual dataset");
    {
      h5::Id type = h5::checked(H5Dget_type(d), H5Tclose, where + ": " + name);
      if (H5Tequal(type, H5T_IEEE_F32LE) <= 0)
        throw Error(where + ": dataset " + name +
                    " is not float32 little-endian (the format stores every tensor so; a reader "
                    "would convert its values)");
    }
    IndexTensor t{name, h5::dataset_dims(d), {}};
    size_t n = 0;
    h5::check(H5Pget_virtual_count(dcpl, &n), where + ": " + name);
    for (size_t i = 0; i < n; ++i) {
      h5::Id vs = h5::checked(H5Pget_virtual_vspace(dcpl, i), H5Sclose, where + ": " + name);
      const size_t nd = t.shape.size();
      std::vector<hsize_t> start(nd), stride(nd), count(nd), block(nd);
      h5::check(
          H5Sget_regular_hyperslab(vs, start.data(), stride.data(), count.data(), block.data()),
          where + ": " + name + ": a mapping is not a regular hyperslab");
      Mapping m;
      for (size_t k = 0; k < nd; ++k) {
        m.dest.start.push_back(static_cast<int64_t>(start[k]));
        m.dest.count.push_back(static_cast<int64_t>(count[k] * block[k]));
      }
      m.file = read_name(H5Pget_virtual_filename, dcpl, i);
      m.dataset = read_name(H5Pget_virtual_dsetname, dcpl, i);
      t.mappings.push_back(std::move(m));
    }
    found.emplace_back(h5::has_attr(d, "index") ? h5::read_attr_int(d, "index", where) : 0,
                       std::move(t));
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [order, t] : found) {
    by_path_[t.path] = tensors_.size();
    try {
      const std::string state = split_tensor_path(t.path).first;
      if (std::find(states_.begin(), states_.end(), state) == states_.end())
        states_.push_back(state);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
    tensors_.push_back(std::move(t));
  }
}

Checkpoint::~Checkpoint() = default;
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;

const IndexTensor* Checkpoint::find(const std::string& path) const {
  auto it = by_path_.find(path);
  return it == by_path_.end() ? nullptr : &tensors_[it->second];
}

hid_t Checkpoint::open_rank_file(const std::string& name, const std::string& tensor) const {
  auto it = files_->open.find(name);
  if (it != files_->open.end()) return it->second;
  const std::string path = (fs::path(dir_) / name).string();
  if (!fs::exists(path))
    throw Error("checkpoint " + dir_ + ": rank file " + name + " (holding part of " + tensor +
                ") is missing");
  if (manifest_) check_file(dir_, *manifest_, name);
  h5::Id file = h5::open_file(path, false);
  const std::string where = "checkpoint " + dir_ + ": rank file " + name;
  // Whose and which step's file it is: a file copied or renamed from another rank, step or run
  // would otherwise be read as this one.
  int rank = -1;
  if (std::sscanf(name.c_str(), "rank_%d.h5", &rank) == 1 && h5::has_attr(file, "rank")) {
    const int64_t holds = h5::read_attr_int(file, "rank", where);
    if (holds != rank)
      throw Error(detail::concat(where, " holds rank ", holds, "'s data (its attribute rank is ",
                                 holds, "): it was copied or renamed from another rank's file"));
  }
  if (h5::has_attr(file, "step")) {  // written since rank files carry their step
    const int64_t step = h5::read_attr_int(file, "step", where);
    if (step != state_.step)
      throw Error(detail::concat(where, " is from step ", step, ", the index from step ",
                                 state_.step, ": the files of two checkpoints were mixed"));
    files_->with_step.insert(name);
  }
  return files_->open.emplace(name, std::move(file)).first->second;
}

void Checkpoint::check_offset(hid_t d, const Mapping& m, const std::string& where) const {
  if (!h5::has_attr(d, "offset")) return;
  const std::vector<int64_t> offset = h5::read_attr_ints(d, "offset", where);
  if (offset != m.dest.start)
    throw Error(where + " holds the box at " + Box{offset, m.dest.count}.str() +
                ", the index maps it at " + m.dest.str() +
                ": a rank file of another rank or layout");
}

namespace {
// Copies `part` (global coordinates) from `src`, laid out row-major as the box `from`, into
// `dst`, laid out as the box `to`: one memcpy per run of the last dimension.
void copy_part(const float* src, const Box& from, float* dst, const Box& to, const Box& part) {
  const size_t nd = part.count.size();
  std::vector<int64_t> idx(nd, 0);  // position in `part`; the last dimension is copied whole
  auto offset = [&](const Box& b) {
    int64_t off = 0;
    for (size_t k = 0; k < nd; ++k) off = off * b.count[k] + part.start[k] + idx[k] - b.start[k];
    return off;
  };
  for (;;) {
    std::memcpy(dst + offset(to), src + offset(from),
                static_cast<size_t>(part.count[nd - 1]) * sizeof(float));
    int k = static_cast<int>(nd) - 2;
    for (; k >= 0; --k) {
      if (++idx[static_cast<size_t>(k)] < part.count[static_cast<size_t>(k)]) break;
      idx[static_cast<size_t>(k)] = 0;
    }
    if (k < 0) return;
  }
}
}  // namespace

std::vector<float> Checkpoint::check_box(int64_t d, const Mapping& m, const std::string& where,
                                         const std::string& tensor) const {
  if (!h5::has_attr(d, kChecksumAttr)) {
    // Files written since rank files carry their step always have it: a missing one was removed.
    if (files_->with_step.count(m.file))
      throw Error(where + " has no " + kChecksumAttr + " attribute (every box of its file's " +
                  "format carries one): the file was edited, so " + tensor + " " + m.dest.str() +
                  " cannot be trusted");
    return {};  // written before boxes carried checksums
  }
  if (!files_->checked.insert(m.file + "/" + m.dataset).second) return {};
  const int64_t numel = m.dest.numel();
  std::vector<float> all;
  uint64_t got = 0;
  if (numel * 4 <= read_bound_) {
    // Small enough to keep: read whole once, checked, and served to the caller from memory.
    all.resize(static_cast<size_t>(numel));
    h5::check(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data()),
              "cannot read " + where);
    got = static_cast<uint64_t>(box_checksum(all.data(), numel));
  } else {
    // In pieces of whole rows along dim 0 (at least one row), hashed as they come: memory
    // bounded by read_bound_ (or one row), whatever the box's size.
    std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(),
                                                                     XXH64_freeState);
    LLMT_CHECK(state && XXH64_reset(state.get(), 0) == XXH_OK, "XXH64 state");
    const std::vector<int64_t>& dims = m.dest.count;
    const int64_t rows = dims.empty() ? 1 : dims[0];
    const int64_t row = rows > 0 ? numel / rows : 0;
    const int64_t step = std::max<int64_t>(1, read_bound_ / 4 / std::max<int64_t>(row, 1));
    std::vector<float> piece;
    h5::Id fspace = h5::checked(H5Dget_space(d), H5Sclose, where);
    for (int64_t r0 = 0; r0 < rows; r0 += step) {
      std::vector<int64_t> start(dims.size(), 0), count = dims;
      start[0] = r0;
      count[0] = std::min(step, rows - r0);
      piece.resize(static_cast<size_t>(count[0] * row));
      h5::Id mem = h5::simple_space(count);
      h5::select(fspace, start, count);
      h5::check(H5Dread(d, H5T_NATIVE_FLOAT, mem, fspace, H5P_DEFAULT, piece.data()),
                "cannot read " + where);
      XXH64_update(state.get(), piece.data(), piece.size() * 4);
    }
    got = XXH64_digest(state.get());
  }
  const int64_t want = h5::read_attr_int(d, kChecksumAttr, where);
  int64_t got_bits;
  std::memcpy(&got_bits, &got, sizeof got_bits);
  if (got_bits != want) {
    files_->checked.erase(m.file + "/" + m.dataset);
    char text[96];
    std::snprintf(text, sizeof text, "(xxh64 %016llx stored, %016llx read)",
                  static_cast<unsigned long long>(want), static_cast<unsigned long long>(got));
    throw Error(where + ": the values read do not match the box's checksum " + text + ": " +
                m.file + " is corrupt (its data or the chunk index that locates it), so " + tensor +
                " " + m.dest.str() + " cannot be trusted");
  }
  return all;
}

h5::Id Checkpoint::open_box(const Mapping& m, const std::string& tensor,
                            const std::string& where) const {
  const hid_t file = open_rank_file(m.file, tensor);
  h5::Id d = h5::open_dataset(file, m.dataset, "checkpoint " + dir_ + ": " + m.file);
  if (h5::dataset_dims(d) != m.dest.count)
    throw Error(where + " does not have the shape " + Box{m.dest.start, m.dest.count}.str() +
                " the index maps");
  check_offset(d, m, where);
  return d;
}

void Checkpoint::read(const std::string& path, const Box& box, float* out) const {
  const IndexTensor* t = find(path);
  if (!t) throw Error("checkpoint " + dir_ + " has no tensor " + path);
  h5::Id mem = h5::simple_space(box.count);
  int64_t covered = 0;
  for (const Mapping& m : t->mappings) {
    const Box part = intersect(m.dest, box);
    if (part.empty()) continue;
    const std::string where = "checkpoint " + dir_ + ": " + m.file + ": dataset " + m.dataset;
    h5::Id d = open_box(m, path, where);
    // The first read of a box checks it (whole, or in pieces when larger than the read bound);
    // a box read whole serves the part from that copy.
    const std::vector<float> whole = check_box(d, m, where, path);
    if (!whole.empty()) {
      copy_part(whole.data(), m.dest, out, box, part);
      covered += part.numel();
      continue;
    }
    h5::Id fspace = h5::checked(H5Dget_space(d), H5Sclose, where);
    std::vector<int64_t> fstart, mstart;
    for (size_t k = 0; k < part.start.size(); ++k) {
      fstart.push_back(part.start[k] - m.dest.start[k]);
      mstart.push_back(part.start[k] - box.start[k]);
    }
    h5::select(fspace, fstart, part.count);
    h5::select(mem, mstart, part.count);
    h5::check(H5Dread(d, H5T_NATIVE_FLOAT, mem, fspace, H5P_DEFAULT, out), "cannot read " + where);
    covered += part.numel();
  }
  if (covered != box.numel())
    throw Error(detail::concat("checkpoint ", dir_, ": ", path, " box ", box.str(), " is ",
                               covered == 0 ? "not covered" : "only partly covered",
                               " by the rank files (", covered, " of ", box.numel(), " elements)"));
}

std::vector<std::string> Checkpoint::check_structure() const {
  std::vector<std::string> errors;
  for (const IndexTensor& t : tensors_) {
    const std::string where = "checkpoint " + dir_ + ": " + t.path;
    Box full;
    full.count = t.shape;
    full.start.assign(t.shape.size(), 0);
    int64_t sum = 0;
    for (size_t i = 0; i < t.mappings.size(); ++i) {
      const Mapping& m = t.mappings[i];
      if (intersect(m.dest, full).numel() != m.dest.numel())
        errors.push_back(where + ": box " + m.dest.str() + " lies outside the tensor");
      for (size_t j = 0; j < i; ++j)
        if (!intersect(m.dest, t.mappings[j].dest).empty())
          errors.push_back(where + ": boxes " + m.dest.str() + " (" + m.file + ") and " +
                           t.mappings[j].dest.str() + " (" + t.mappings[j].file + ") overlap");
      sum += m.dest.numel();
      const std::string file = (fs::path(dir_) / m.file).string();
      if (!fs::exists(file)) {
        errors.push_back(where + ": rank file " + m.file + " is missing");
        continue;
      }
      try {
        const hid_t f = open_rank_file(m.file, t.path);
        h5::Id d = h5::open_dataset(f, m.dataset, "checkpoint " + dir_ + ": " + m.file);
        if (h5::dataset_dims(d) != m.dest.count)
          errors.push_back(where + ": " + m.file + ": dataset " + m.dataset +
                           " does not have the mapped shape");
        else
          check_offset(d, m, "checkpoint " + dir_ + ": " + m.file + ": dataset " + m.dataset);
      } catch (const Error& e) {
        errors.push_back(e.what());
      }
    }
    if (sum != full.numel())
      errors.push_back(
          detail::concat(where, ": the rank files cover ", sum, " of ", full.numel(), " elements"));
  }
  return errors;
}

std::vector<std::string> Checkpoint::verify() const {
  std::vector<std::string> errors = check_structure();
  for (const IndexTensor& t : tensors_) {
    for (const Mapping& m : t.mappings) {
      // Every box checked (read in bounded pieces), nothing kept.
      try {
        const std::string where = "checkpoint " + dir_ + ": " + m.file + ": dataset " + m.dataset;
        h5::Id d = open_box(m, t.path, where);
        check_box(d, m, where, t.path);
      } catch (const Error& e) {
        errors.push_back(e.what());
      }
    }
  }
  // The same problem can surface in both passes (a file that cannot be opened): report it once.
  std::vector<std::string> unique;
  for (std::string& e : errors)
    if (std::find(unique.begin(), unique.end(), e) == unique.end()) unique.push_back(std::move(e));
  return unique;
}

}  // namespace llmt::ckpt

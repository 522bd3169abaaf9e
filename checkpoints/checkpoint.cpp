#include "checkpoints/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "checkpoints/h5.h"

namespace llmt::ckpt {

namespace fs = std::filesystem;

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

namespace {
// "\"param\", \"exp_avg\"".
std::string join_quoted(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", \"" : "\"") + v[i] + "\"";
  return out.empty() ? "nothing" : out;
}

bool is_step_dir(const fs::directory_entry& e) {
  const std::string n = e.path().filename().string();
  return e.is_directory() && n.size() == 13 && n.rfind("step_", 0) == 0 &&
         std::all_of(n.begin() + 5, n.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The checkpoint DIR/latest names, or nullopt when there is no `latest` file.
std::optional<std::string> read_latest(const fs::path& dir) {
  std::ifstream in(dir / kLatestFile);
  if (!in) return std::nullopt;
  std::string name;
  std::getline(in, name);
  while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos)
    throw ConfigError("checkpoint " + (dir / kLatestFile).string() + " names \"" + name +
                      "\", expected a directory name like step_00000100");
  return (dir / name).string();
}

std::string require_complete(const std::string& path, const std::string& asked) {
  if (!fs::exists(fs::path(path) / kIndexFile))
    throw ConfigError("checkpoint.load=\"" + asked + "\": " + path +
                      " is not a complete checkpoint (no " + kIndexFile + ")");
  return path;
}

// Every rank learns whether all succeeded; those that did not throw their own message, the
// others say which rank failed first.
void agree(Communicator& world, const std::string& error, const char* what) {
  // The max of -rank over the ranks that failed (-size if none): minus the first failed rank.
  int32_t neg = error.empty() ? -world.size() : -world.rank();
  if (world.size() > 1) world.all_reduce(Tensor(&neg, {1}, DType::i32), ReduceOp::max).wait();
  const int first_bad = -neg;
  if (!error.empty()) throw Error(error);
  if (first_bad < world.size())
    throw Error(detail::concat(what, " failed on rank ", first_bad, " (see its message)"));
}

void write_latest(const fs::path& dir, const std::string& name) {
  const fs::path tmp = dir / (std::string(kTempPrefix) + kLatestFile);
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << name << "\n";
    out.close();
    if (!out) throw Error("cannot write " + tmp.string());
  }
  h5::fsync_path(tmp.string());
  fs::rename(tmp, dir / kLatestFile);
  h5::fsync_path(dir.string());
}

// Keeps the newest keep_last checkpoints (by step), never removing `current`.
void prune(const fs::path& dir, int64_t keep_last, const std::string& current) {
  if (keep_last <= 0) return;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (is_step_dir(e) && e.path().filename() != current)
      names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());  // zero-padded: name order is step order
  const int64_t keep_others = keep_last - 1;
  for (int64_t i = 0; i + keep_others < static_cast<int64_t>(names.size()); ++i)
    fs::remove_all(dir / names[static_cast<size_t>(i)]);
}

}  // namespace

std::optional<std::string> resolve_load(const CheckpointConfig& cfg) {
  if (cfg.load == "none") return std::nullopt;
  if (cfg.load == "latest" || cfg.load == "auto") {
    if (cfg.dir.empty())
      throw ConfigError("checkpoint.load=\"" + cfg.load + "\" needs checkpoint.dir");
    std::optional<std::string> latest = read_latest(cfg.dir);
    if (!latest) {
      // "auto" starts fresh only in a directory without checkpoints: one whose `latest` was
      // lost would otherwise be trained over and its steps overwritten.
      std::vector<std::string> steps;
      std::error_code ec;
      if (fs::is_directory(cfg.dir, ec))
        for (const auto& e : fs::directory_iterator(cfg.dir))
          if (is_step_dir(e)) steps.push_back(e.path().filename().string());
      std::sort(steps.begin(), steps.end());
      if (cfg.load == "auto" && steps.empty()) return std::nullopt;
      if (!steps.empty())
        throw ConfigError(
            "checkpoint.load=\"" + cfg.load + "\": " + cfg.dir + " has " +
            std::to_string(steps.size()) + " checkpoint directories (" + steps.front() +
            (steps.size() > 1 ? " ... " + steps.back() : "") + ") but no " + kLatestFile +
            " file naming the one to resume; refusing "
            "to start from initialisation over them. Resume one explicitly "
            "(checkpoint.load = \"" +
            (fs::path(cfg.dir) / steps.back()).string() + "\"), or restore " + kLatestFile);
      throw ConfigError("checkpoint.load=\"latest\": " + cfg.dir +
                        " has no complete checkpoint (no " + kLatestFile +
                        " file); use load = \"none\" to start from initialisation, or \"auto\"");
    }
    return require_complete(*latest, cfg.load);
  }
  try {
    return require_complete(resolve_checkpoint_dir(cfg.load), cfg.load);
  } catch (const ConfigError& e) {
    throw ConfigError("checkpoint.load=\"" + cfg.load + "\": " + e.what());
  }
}

std::string resolve_checkpoint_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) throw ConfigError("checkpoint directory " + dir + " does not exist");
  if (fs::exists(fs::path(dir) / kIndexFile)) return dir;
  if (std::optional<std::string> latest = read_latest(dir)) return *latest;
  throw ConfigError("checkpoint directory " + dir + " has no " + kIndexFile + " and no " +
                    kLatestFile + " file: give a checkpoint (DIR/step_NNNNNNNN)");
}

std::vector<std::string> remove_leftovers(const std::string& dir) {
  std::vector<std::string> removed;
  if (dir.empty() || !fs::is_directory(dir)) return removed;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(kTempPrefix, 0) != 0) continue;
    fs::remove_all(e.path());
    removed.push_back(n);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

void check_model(const Checkpoint& ckpt, const ModelSpec& spec,
                 const std::vector<std::string>& states) {
  auto shape_text = [](const std::vector<int64_t>& s) {
    std::string t = "(";
    for (size_t i = 0; i < s.size(); ++i) t += detail::concat(i ? ", " : "", s[i]);
    return t + (s.size() == 1 ? ",)" : ")");
  };
  auto has = [](const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  std::vector<std::string> expected_states = states;
  if (!has(expected_states, kMasterState))
    expected_states.insert(expected_states.begin(), kMasterState);
  // Another optimizer: one message that says so, not one per tensor whose states differ.
  const bool muon_run = has(expected_states, kMuonState),
             muon_ckpt = has(ckpt.states(), kMuonState);
  if (muon_run != muon_ckpt)
    throw ConfigError("checkpoint " + ckpt.dir() + " was written by optimizer.type = \"" +
                      (muon_ckpt ? "muon" : "adamw") + "\" (it stores the states " +
                      join_quoted(ckpt.states()) + "); this run uses optimizer.type = \"" +
                      (muon_run ? "muon" : "adamw") + "\" (" + join_quoted(expected_states) +
                      "). Resume it with optimizer.type = \"" + (muon_ckpt ? "muon" : "adamw") +
                      "\", or start a new run from its weights with checkpoint.init_from");
  std::vector<std::string> problems;
  // A state one side keeps and the other does not is one problem, not one per tensor.
  for (const std::string& st : expected_states)
    if (!has(ckpt.states(), st))
      problems.push_back(state_group(st) +
                         "/: missing from the checkpoint (this run keeps the "
                         "state \"" +
                         st + "\"; the checkpoint stores " + join_quoted(ckpt.states()) + ")");
  for (const std::string& st : ckpt.states())
    if (!has(expected_states, st))
      problems.push_back(state_group(st) + "/: the checkpoint stores the state \"" + st +
                         "\", which this run does not keep (it keeps " +
                         join_quoted(expected_states) + ")");
  std::map<std::string, bool> expected;
  for (const std::string& st : expected_states) {
    if (!has(ckpt.states(), st)) continue;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      if (!keeps_state(expected_states, st, spec.is_hidden_matrix(i))) continue;
      const ParamSpec& p = spec.params[i];
      const std::string path = tensor_path(st, p.name);
      expected[path] = true;
      const std::vector<int64_t> want = whole(p.global_shape).count;
      const IndexTensor* t = ckpt.find(path);
      if (!t)
        problems.push_back(path + ": missing from the checkpoint (the model expects " +
                           shape_text(want) + ")");
      else if (t->shape != want)
        problems.push_back(path + ": the checkpoint has shape " + shape_text(t->shape) +
                           ", the model expects " + shape_text(want));
    }
  }
  for (const IndexTensor& t : ckpt.tensors())
    if (!expected.count(t.path) && has(expected_states, split_tensor_path(t.path).first))
      problems.push_back(t.path + ": not a tensor of this model");
  if (problems.empty()) return;
  std::string msg = "checkpoint " + ckpt.dir() + " does not fit the model of this config (" +
                    std::to_string(problems.size()) + " problems):";
  for (const std::string& p : problems) msg += "\n  " + p;
  throw ConfigError(msg);
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

PendingSave::PendingSave(const CheckpointConfig& cfg, const RunState& run, const ModelSpec& spec,
                         const ModelSpec& tp_spec, TrainingState& state, Mesh& mesh,
                         DeviceBackend& backend, bool background, HostBuffer* staging)
    : cfg_(cfg),
      run_(run),
      spec_(spec),
      tp_spec_(tp_spec),
      states_(state.state_names()),
      mesh_(mesh),
      start_(std::chrono::steady_clock::now()),
      staging_(staging ? staging : &own_staging_) {
  const bool rank0 = mesh.rank() == 0;
  const fs::path dir = cfg.dir;
  name_ = step_dir_name(run.step);
  tmp_ = (dir / (std::string(kTempPrefix) + name_)).string();
  std::string error;
  if (rank0) {
    try {
      fs::create_directories(dir);
      fs::remove_all(tmp_);
      fs::create_directory(tmp_);
    } catch (const std::exception& e) {
      error = "checkpoint: cannot create " + tmp_ + ": " + e.what();
    }
  }
  agree(mesh.world(), error, "checkpoint: creating the directory");

  // This rank's pieces, from the state tensors that hold their rows.
  std::map<std::pair<std::string, size_t>, std::vector<StateTensor>> held;
  for (const StateTensor& st : state.state_tensors()) held[{st.state, st.param}].push_back(st);
  for (const Piece& pc :
       pieces_to_write(tp_spec, mesh.shape(), mesh.rank(), states_, run.zero_shard_group)) {
    const ParamSpec& p = tp_spec.params[pc.param];
    const int64_t row_numel = p.shape.numel() / tp_spec.cut_rows(pc.param);
    const StateTensor* src = nullptr;
    for (const StateTensor& st : held[{pc.state, pc.param}])
      if (st.row_begin <= pc.row_begin && st.row_begin + st.local.numel() / row_numel >= pc.row_end)
        src = &st;
    LLMT_CHECK(src, "checkpoint: this rank must write rows [", pc.row_begin, ", ", pc.row_end,
               ") of ", tensor_path(pc.state, p.name), " but does not hold them");
    pieces_.push_back({pc,
                       src->local.f32() + (pc.row_begin - src->row_begin) * row_numel,
                       (pc.row_end - pc.row_begin) * row_numel,
                       {}});
  }
  if (!background) {
    // Straight from the device tensors, through one host buffer.
    write_file(&backend);
    blocked_s_ = seconds_since(start_);
    return;
  }
  // Snapshot this rank's pieces to host memory; training goes on while a thread writes them.
  int64_t total = 0;
  for (PieceData& pd : pieces_) {
    pd.offset = total;
    total += pd.numel;
  }
  staging_->reserve(backend, static_cast<size_t>(total) * 4);
  for (const PieceData& pd : pieces_)
    backend.copy_to_host(staging_->f32() + pd.offset, pd.device, static_cast<size_t>(pd.numel) * 4);
  writer_ = std::thread([this] { write_file(nullptr); });
  blocked_s_ = seconds_since(start_);
}

PendingSave::~PendingSave() {
  if (writer_.joinable()) writer_.join();
}

void PendingSave::write_file(DeviceBackend* backend) {
  const std::string path = (fs::path(tmp_) / rank_file_name(mesh_.rank())).string();
  try {
    ShardFileWriter out(path, mesh_.rank(), run_.step);
    for (const PieceData& pd : pieces_) {
      // Background: the snapshot. Synchronous: one piece at a time through the same staging
      // buffer, which a caller that keeps it allocates (and pins) once.
      const float* host = staging_->f32() + pd.offset;
      if (backend) {
        staging_->reserve(*backend, static_cast<size_t>(pd.numel) * 4);
        backend->copy_to_host(staging_->data(), pd.device, static_cast<size_t>(pd.numel) * 4);
        host = staging_->f32();
      }
      const std::string& name = tp_spec_.params[pd.piece.param].name;
      const auto boxes =
          global_boxes(tp_spec_, pd.piece.param, pd.piece.row_begin, pd.piece.row_end);
      for (size_t b = 0; b < boxes.size(); ++b)
        out.write(shard_dataset(pd.piece.state, name, b), boxes[b].global,
                  host + boxes[b].local_offset);
    }
    out.close();
    bytes_ = out.bytes_written();
    written_files_.push_back(hash_file(tmp_, rank_file_name(mesh_.rank())));
    // The index depends on the layout only: rank 0 writes it while the other ranks' files are
    // still being written; nothing is visible before poll() renames the directory.
    if (mesh_.rank() == 0) {
      write_index(tmp_, run_, plan_index(spec_, write_layout(run_), states_));
      written_files_.push_back(hash_file(tmp_, kIndexFile));
      h5::fsync_path(tmp_);
    }
  } catch (const std::exception& e) {
    error_ = "checkpoint: writing " + path + " (or the index) failed: " + e.what();
  }
  write_s_ = seconds_since(start_);
  written_.store(true);
}

bool PendingSave::poll(bool wait) {
  if (finished_) return true;
  const auto t0 = std::chrono::steady_clock::now();
  Communicator& world = mesh_.world();
  if (wait && writer_.joinable()) writer_.join();
  // Every rank learns whether all files are written (a collective: all ranks poll alike).
  int32_t pending = written_.load() ? 0 : 1;
  if (world.size() > 1) world.all_reduce(Tensor(&pending, {1}, DType::i32), ReduceOp::max).wait();
  if (pending) {
    blocked_s_ += seconds_since(t0);
    return false;
  }
  if (writer_.joinable()) writer_.join();
  own_staging_.reset();  // the snapshot, unless the caller keeps it for the next save
  agree(world, error_, "checkpoint: writing the rank files");

  // The manifest: every rank's file (its size and XXH64 as the rank computed it) and the index,
  // written by rank 0 as the last file before the rename.
  const int world_size = world.size();
  std::vector<double> sizes(static_cast<size_t>(2 * world_size));  // (bytes, xxh64) bit patterns
  double mine[2];
  std::memcpy(&mine[0], &written_files_.front().bytes, 8);
  std::memcpy(&mine[1], &written_files_.front().xxh64, 8);
  if (world_size > 1)
    world
        .all_gather(Tensor(sizes.data(), {2 * world_size}, DType::f64),
                    Tensor(mine, {2}, DType::f64))
        .wait();
  else
    std::copy(mine, mine + 2, sizes.begin());
  std::string error;
  const fs::path dir = cfg_.dir, final_dir = dir / name_;
  if (mesh_.rank() == 0) {
    try {
      Manifest manifest;
      manifest.step = run_.step;
      manifest.files.push_back(written_files_.back());  // index.h5
      for (int r = 0; r < world_size; ++r) {
        ManifestFile f{rank_file_name(r), 0, 0};
        std::memcpy(&f.bytes, &sizes[static_cast<size_t>(2 * r)], 8);
        std::memcpy(&f.xxh64, &sizes[static_cast<size_t>(2 * r + 1)], 8);
        manifest.files.push_back(f);
      }
      write_manifest(tmp_, manifest);
      // A checkpoint of this step from an earlier run is replaced only once the new one is whole.
      const fs::path old = dir / (std::string(kTempPrefix) + "old." + name_);
      if (fs::exists(final_dir)) fs::rename(final_dir, old);
      fs::rename(tmp_, final_dir);
      h5::fsync_path(dir.string());
      write_latest(dir, name_);
      fs::remove_all(old);
      prune(dir, cfg_.keep_last, name_);
    } catch (const std::exception& e) {
      error = "checkpoint: finishing " + final_dir.string() + " failed: " + e.what();
    }
  }
  agree(world, error, "checkpoint: finishing the directory");

  float bytes = static_cast<float>(bytes_);
  if (world.size() > 1) world.all_reduce(Tensor(&bytes, {1}, DType::f32)).wait();
  result_.bytes = static_cast<int64_t>(bytes);
  result_.path = final_dir.string();
  result_.write_seconds = write_s_;
  result_.total_seconds = seconds_since(start_);
  blocked_s_ += seconds_since(t0);
  result_.blocked_seconds = blocked_s_;
  finished_ = true;
  return true;
}

SaveResult save(const CheckpointConfig& cfg, const RunState& run, const ModelSpec& spec,
                const ModelSpec& tp_spec, TrainingState& state, Mesh& mesh,
                DeviceBackend& backend) {
  PendingSave s(cfg, run, spec, tp_spec, state, mesh, backend, /*background=*/false);
  s.poll(true);
  return s.result();
}

int64_t load(const Checkpoint& ckpt, const ModelSpec& tp_spec, TrainingState& state,
             DeviceBackend& backend, bool weights_only) {
  HostBuffer host;  // one state tensor at a time (pinned on a GPU)
  int64_t bytes = 0;
  for (const StateTensor& st : state.state_tensors()) {
    if (weights_only && st.state != kMasterState) continue;
    const ParamSpec& p = tp_spec.params[st.param];
    const int64_t rows = st.local.numel() / (p.shape.numel() / tp_spec.cut_rows(st.param));
    const size_t n = static_cast<size_t>(st.local.numel());
    host.reserve(backend, n * 4);
    std::fill_n(host.f32(), n, 0.0f);
    for (const LocalBox& lb : global_boxes(tp_spec, st.param, st.row_begin, st.row_begin + rows))
      ckpt.read(tensor_path(st.state, p.name), lb.global, host.f32() + lb.local_offset);
    backend.copy_from_host(st.local.data, host.data(), n * 4);
    bytes += static_cast<int64_t>(n) * 4;
  }
  state.after_load();
  return bytes;
}

}  // namespace llmt::ckpt

#include "checkpoints/tools.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "checkpoints/checkpoint.h"
#include "checkpoints/h5.h"

namespace llmt::ckpt {

namespace fs = std::filesystem;

std::string inspect(const Checkpoint& ckpt, bool with_config) {
  const RunState& s = ckpt.state();
  std::string out =
      detail::concat("checkpoint ", ckpt.dir(), "\n", "step ", s.step, ", updates ", s.updates,
                     ", consumed_samples ", s.consumed_samples, ", seed ", s.seed, "\n",
                     "loss_scale ", s.loss_scale, " (", s.loss_scale_clean_steps, " clean steps)\n",
                     "layout: ", layout_text(s), " (", s.mesh.world(), " rank files)\n");
  if (with_config) out += "\n# config\n" + s.config + "\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-48s %-16s %-5s %14s %6s\n", "tensor", "shape", "dtype",
                "l2 norm", "boxes");
  out += line;
  std::vector<float> buf;
  for (const IndexTensor& t : ckpt.tensors()) {
    // The norm box by box, each read once (bounded memory).
    double sum = 0;
    for (const Mapping& m : t.mappings) {
      buf.resize(static_cast<size_t>(m.dest.numel()));
      ckpt.read(t.path, m.dest, buf.data());
      for (float v : buf) sum += static_cast<double>(v) * v;
    }
    std::string shape = "(";
    for (size_t d = 0; d < t.shape.size(); ++d) shape += detail::concat(d ? ", " : "", t.shape[d]);
    shape += ")";
    std::snprintf(line, sizeof line, "%-48s %-16s %-5s %14.6g %6zu\n", t.path.c_str(),
                  shape.c_str(), "f32", std::sqrt(sum), t.mappings.size());
    out += line;
  }
  return out;
}

VerifyReport verify(const Checkpoint& ckpt, const ModelSpec& spec) {
  VerifyReport r;
  r.errors = ckpt.verify();
  try {
    check_model(ckpt, spec, ckpt.states());
  } catch (const Error& e) {
    r.errors.push_back(e.what());
  }
  r.tensors = static_cast<int64_t>(ckpt.tensors().size());
  for (const IndexTensor& t : ckpt.tensors()) {
    r.boxes += static_cast<int64_t>(t.mappings.size());
    for (const Mapping& m : t.mappings) r.bytes += m.dest.numel() * 4;
  }
  return r;
}

int64_t reshard(const Checkpoint& src, const ModelSpec& spec, const RunState& state,
                const std::string& out) {
  check_model(src, spec, src.states());
  if (fs::exists(out)) throw Error("checkpoint reshard: " + out + " already exists");
  const fs::path final_dir = fs::absolute(out).lexically_normal();
  const fs::path tmp =
      final_dir.parent_path() / (std::string(kTempPrefix) + final_dir.filename().string());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const WriteLayout layout = write_layout(state);
  const MeshShape& mesh = layout.mesh;
  int64_t bytes = 0;
  std::vector<float> buf;
  for (int r = 0; r < mesh.world(); ++r) {
    const ModelSpec tp_spec = parallelize(spec, layout, r);
    ShardFileWriter w((tmp / rank_file_name(r)).string(), r, state.step);
    for (const Piece& pc : pieces_to_write(tp_spec, mesh, r, src.states())) {
      const std::string& name = tp_spec.params[pc.param].name;
      const auto boxes = global_boxes(tp_spec, pc.param, pc.row_begin, pc.row_end);
      for (size_t b = 0; b < boxes.size(); ++b) {
        buf.resize(static_cast<size_t>(boxes[b].global.numel()));
        src.read(tensor_path(pc.state, name), boxes[b].global, buf.data());
        w.write(shard_dataset(pc.state, name, b), boxes[b].global, buf.data());
      }
    }
    w.close();
    bytes += w.bytes_written();
  }
  write_index(tmp.string(), state, plan_index(spec, layout, src.states()));
  write_manifest_of(tmp.string(), state.step, mesh.world());
  h5::fsync_path(tmp.string());
  fs::rename(tmp, final_dir);
  h5::fsync_path(final_dir.parent_path().string());
  return bytes;
}

}  // namespace llmt::ckpt

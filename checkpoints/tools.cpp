#include "checkpoints/tools.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "checkpoints/checkpoint.h"
#include "checkpoints/h5.h"

namespace llmt::ckpt {

namespace fs = std::filesystem;

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t d = 0; d < shape.size(); ++d) out += detail::concat(d ? ", " : "", shape[d]);
  return out + ")";
}

// The largest box of the checkpoint, in bytes, and where it is.
ToolMemory largest_box(const Checkpoint& ckpt) {
  ToolMemory out;
  for (const IndexTensor& t : ckpt.tensors())
    for (const Mapping& m : t.mappings)
      if (m.dest.numel() * 4 > out.bytes)
        out = {m.dest.numel() * 4, t.path + " " + shape_text(m.dest.count) + " in " + m.file};
  return out;
}

// A row of `box` (elements; the whole box when it has no rows).
int64_t row_of(const Box& box) {
  return box.count.empty() || box.count[0] == 0 ? box.numel() : box.numel() / box.count[0];
}

// `box` cut along dim 0 into pieces of at most `bound` bytes (at least one row each).
std::vector<Box> row_pieces(const Box& box, int64_t bound) {
  if (box.count.empty() || box.numel() * 4 <= bound) return {box};
  const int64_t step = std::max<int64_t>(1, bound / 4 / std::max<int64_t>(row_of(box), 1));
  std::vector<Box> out;
  for (int64_t r = 0; r < box.count[0]; r += step) {
    Box p = box;
    p.start[0] = box.start[0] + r;
    p.count[0] = std::min(step, box.count[0] - r);
    out.push_back(p);
  }
  return out;
}

}  // namespace

ToolMemory verify_memory(const Checkpoint& ckpt) {
  ToolMemory big = largest_box(ckpt);
  if (big.bytes <= ckpt.read_bound()) return {big.bytes, "the largest box, " + big.what};
  return {ckpt.read_bound(),
          "the read bound: boxes over it, such as " + big.what + ", are checked in pieces"};
}

ToolMemory inspect_memory(const Checkpoint& ckpt) {
  ToolMemory r = verify_memory(ckpt);
  r.bytes *= 2;  // the box checked whole, and the piece the norm reads from it
  r.what += ", read twice over (checked, then summed)";
  return r;
}

ToolMemory reshard_memory(const Checkpoint& src, const ModelSpec& spec, const RunState& state) {
  const WriteLayout layout = write_layout(state);
  ToolMemory out;
  for (int r = 0; r < layout.mesh.world(); ++r) {
    const ModelSpec tp_spec = parallelize(spec, layout, r);
    for (const Piece& pc :
         pieces_to_write(tp_spec, layout.mesh, r, src.states(), layout.zero_shard_group)) {
      const std::string& name = tp_spec.params[pc.param].name;
      for (const auto& b : global_boxes(tp_spec, pc.param, pc.row_begin, pc.row_end))
        if (b.global.numel() * 4 > out.bytes)
          out = {b.global.numel() * 4, "the largest box written, " + tensor_path(pc.state, name) +
                                           " " + shape_text(b.global.count) + " for " +
                                           rank_file_name(r)};
    }
  }
  const ToolMemory read = verify_memory(src);
  out.bytes += read.bytes;
  out.what += ", and " + read.what;
  return out;
}

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
    // The norm box by box, a box over the read bound in pieces of whole rows (bounded memory).
    double sum = 0;
    for (const Mapping& m : t.mappings) {
      for (const Box& piece : row_pieces(m.dest, ckpt.read_bound())) {
        buf.resize(static_cast<size_t>(piece.numel()));
        ckpt.read(t.path, piece, buf.data());
        for (float v : buf) sum += static_cast<double>(v) * v;
      }
    }
    const std::string shape = shape_text(t.shape);
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
    for (const Piece& pc :
         pieces_to_write(tp_spec, mesh, r, src.states(), layout.zero_shard_group)) {
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

#include "checkpoints/import.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "checkpoints/export.h"
#include "config/json.h"
#include "core/check.h"
#include "engine/model/model_spec.h"

namespace llmt::ckpt {

namespace fs = std::filesystem;
static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader uses host floats as they are");

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Reads config.json's members into a ModelConfig, collecting what does not fit.
class ConfigReader {
 public:
  ConfigReader(const Json& j, const std::string& what) : j_(j), what_(what) {}

  const Json* get(const char* key) const { return j_.find(key); }
  bool present(const char* key) const {
    const Json* v = get(key);
    return v && !v->is_null();
  }
  int64_t integer(const char* key, int64_t fallback = -1) { return whole(key, fallback, 1); }
  // A count that may be 0 (absent: 0).
  int64_t count(const char* key) { return whole(key, 0, 0); }
  float real(const char* key, float fallback) {
    const Json* v = get(key);
    if (!v || v->is_null()) return fallback;
    if (v->kind != Json::Kind::number) {
      problems.push_back(detail::concat(key, ": not a number"));
      return fallback;
    }
    return static_cast<float>(v->number);
  }
  bool flag(const char* key, bool fallback) {
    const Json* v = get(key);
    if (!v || v->is_null()) return fallback;
    if (v->kind != Json::Kind::boolean) {
      problems.push_back(detail::concat(key, ": not true or false"));
      return fallback;
    }
    return v->boolean;
  }
  int64_t whole(const char* key, int64_t fallback, int64_t least) {
    const Json* v = get(key);
    if (!v || v->is_null()) {
      if (fallback < 0) problems.push_back(detail::concat(key, ": missing"));
      return fallback;
    }
    if (v->kind != Json::Kind::number || v->number != std::floor(v->number) ||
        v->number < static_cast<double>(least) || v->number > 9.007199254740992e15) {
      problems.push_back(
          detail::concat(key, least > 0 ? ": not a positive integer" : ": not an integer >= 0"));
      return fallback;
    }
    return static_cast<int64_t>(v->number);
  }
  std::string text(const char* key, const std::string& fallback) {
    const Json* v = get(key);
    if (!v || v->is_null()) return fallback;
    if (v->kind != Json::Kind::string) {
      problems.push_back(detail::concat(key, ": not a string"));
      return fallback;
    }
    return v->string;
  }
  std::vector<std::string> problems;

 private:
  const Json& j_;
  const std::string& what_;
};

std::string json_text(const Json& v);

// config.json's rope_scaling (absent or null: none; "rope_type", or the older "type") into
// c.rope_scaling: "default", "linear", "llama3" and "yarn" (kernels/rope_math.h), each key as
// Hugging Face names it; other types, unknown keys and YaRN without truncation are problems.
// `deepseek`: the class applies YaRN's mscale_all_dim to the scores (DeepseekV3Attention);
// LlamaAttention does not, so a Llama's mscale_all_dim is a problem.
void read_rope_scaling(ConfigReader& r, ModelConfig& c, bool deepseek) {
  const Json* v = r.get("rope_scaling");
  if (!v || v->is_null()) return;
  if (v->kind != Json::Kind::object) {
    r.problems.push_back("rope_scaling " + json_text(*v) + ": not an object");
    return;
  }
  const std::string what = "rope_scaling";
  ConfigReader s(*v, what);
  const std::string type = s.text("rope_type", s.text("type", "default"));
  RopeScaling& out = c.rope_scaling;
  std::set<std::string> known{"rope_type", "type", "factor"};
  if (type == "default") {
    known = {"rope_type", "type"};
  } else if (type == "linear") {
    out.rope_type = RopeType::linear;
  } else if (type == "llama3") {
    out.rope_type = RopeType::llama3;
    out.low_freq_factor = s.real("low_freq_factor", -1.0f);
    out.high_freq_factor = s.real("high_freq_factor", -1.0f);
    out.original_max_position_embeddings = s.integer("original_max_position_embeddings");
    known.insert({"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  } else if (type == "yarn") {
    out.rope_type = RopeType::yarn;
    out.original_max_position_embeddings = s.integer("original_max_position_embeddings");
    out.beta_fast = s.real("beta_fast", 32.0f);
    out.beta_slow = s.real("beta_slow", 1.0f);
    out.mscale = s.real("mscale", 1.0f);
    out.mscale_all_dim = s.real("mscale_all_dim", 0.0f);
    out.attention_factor = s.real("attention_factor", 0.0f);
    if (!s.flag("truncate", true))
      s.problems.push_back("truncate false: llmtrain's YaRN rounds the ramp's ends to whole pairs");
    if (out.mscale_all_dim != 0.0f && !deepseek)
      s.problems.push_back(
          "mscale_all_dim: transformers' LlamaAttention does not scale the scores by it, "
          "llmtrain would");
    known.insert({"original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                  "mscale_all_dim", "attention_factor", "truncate"});
  } else {
    s.problems.push_back("rope_type \"" + type +
                         "\": llmtrain scales RoPE as \"linear\", \"llama3\" or \"yarn\"");
  }
  if (out.rope_type != RopeType::none) out.factor = s.real("factor", -1.0f);
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"})
    if (known.count(key) && !s.present(key)) s.problems.push_back(std::string(key) + ": missing");
  for (const auto& [key, value] : v->members)
    if (!known.count(key) && !value.is_null())
      s.problems.push_back(key + " " + json_text(value) + ": not read by rope_type \"" + type +
                           "\"");
  for (const std::string& p : s.problems) r.problems.push_back("rope_scaling." + p);
}

std::string json_text(const Json& v) {
  switch (v.kind) {
    case Json::Kind::null:
      return "null";
    case Json::Kind::boolean:
      return v.boolean ? "true" : "false";
    case Json::Kind::number:
      return detail::concat(v.number);
    case Json::Kind::string:
      return "\"" + v.string + "\"";
    default:
      return v.kind == Json::Kind::array ? "[...]" : "{...}";
  }
}

// ---- safetensors ----

struct StTensor {
  fs::path file;
  std::string dtype;  // F32, BF16, F16
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // absolute file offsets
};

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
  } else if (exp == 31) {
    f = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    const uint32_t bits = ((exp + 112u) << 23) | (mant << 13);
    std::memcpy(&f, &bits, 4);
  }
  uint32_t out;
  std::memcpy(&out, &f, 4);
  out |= sign;
  std::memcpy(&f, &out, 4);
  return f;
}

// Every tensor of the folder's safetensors files, by name.
std::map<std::string, StTensor> list_safetensors(const fs::path& dir) {
  std::vector<fs::path> files;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const Json j = parse_json(read_text(index), index.string());
    const Json* map = j.find("weight_map");
    if (!map || map->kind != Json::Kind::object)
      throw Error(index.string() + ": no weight_map object");
    std::set<std::string> seen;
    for (const auto& [name, file] : map->members) {
      if (file.kind != Json::Kind::string || file.string.find('/') != std::string::npos)
        throw Error(index.string() + ": " + name + " maps to no file of the folder");
      if (seen.insert(file.string).second) files.push_back(dir / file.string);
    }
  } else {
    files.push_back(dir / "model.safetensors");
  }
  std::map<std::string, StTensor> out;
  for (const fs::path& path : files) {
    if (!fs::exists(path)) throw Error("Hugging Face weights: " + path.string() + " is missing");
    const uint64_t size = fs::file_size(path);
    std::ifstream in(path, std::ios::binary);
    unsigned char n8[8];
    if (!in.read(reinterpret_cast<char*>(n8), 8)) throw Error(path.string() + ": too short");
    uint64_t n = 0;
    for (int b = 7; b >= 0; --b) n = (n << 8) | n8[b];
    if (n > 100'000'000 || 8 + n > size)
      throw Error(detail::concat(path.string(), ": a header of ", n, " bytes in a file of ", size,
                                 ": not a safetensors file"));
    std::string header(n, '\0');
    in.read(header.data(), static_cast<std::streamsize>(n));
    const Json j = parse_json(header, path.string() + " (header)");
    if (j.kind != Json::Kind::object) throw Error(path.string() + ": the header is not an object");
    const uint64_t data = 8 + n;
    for (const auto& [name, t] : j.members) {
      if (name == "__metadata__") continue;
      const std::string where = path.string() + ": " + name;
      const Json* dtype = t.find("dtype");
      const Json* shape = t.find("shape");
      const Json* offsets = t.find("data_offsets");
      if (!dtype || dtype->kind != Json::Kind::string || !shape ||
          shape->kind != Json::Kind::array || !offsets || offsets->items.size() != 2)
        throw Error(where + ": needs dtype, shape and data_offsets");
      StTensor st{path, dtype->string, {}, 0, 0};
      uint64_t numel = 1;
      for (const Json& d : shape->items) {
        if (d.kind != Json::Kind::number || d.number < 0 || d.number > 1e15)
          throw Error(where + ": a bad shape");
        st.shape.push_back(static_cast<int64_t>(d.number));
        numel *= static_cast<uint64_t>(d.number);
      }
      st.begin = data + static_cast<uint64_t>(offsets->items[0].number);
      st.end = data + static_cast<uint64_t>(offsets->items[1].number);
      if (st.end < st.begin || st.end > size)
        throw Error(where + ": its data lies outside the file");
      const size_t b = dtype_bytes(st.dtype);
      if (b != 0 && st.end - st.begin != numel * b)
        throw Error(where + ": data_offsets do not hold its shape");
      out[name] = std::move(st);
    }
  }
  return out;
}

// The tensor's values as float32.
void read_tensor(const StTensor& t, const std::string& name, std::vector<float>& out) {
  const size_t b = dtype_bytes(t.dtype);
  if (b == 0)
    throw Error(t.file.string() + ": " + name + " has dtype " + t.dtype +
                "; import reads F32, BF16 and F16");
  const size_t n = (t.end - t.begin) / b;
  std::vector<char> raw(t.end - t.begin);
  std::ifstream in(t.file, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(t.begin));
  if (!in.read(raw.data(), static_cast<std::streamsize>(raw.size())))
    throw Error(t.file.string() + ": reading " + name + " failed");
  out.resize(n);
  if (t.dtype == "F32") {
    std::memcpy(out.data(), raw.data(), raw.size());
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, raw.data() + 2 * i, 2);
    if (t.dtype == "BF16") {
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      std::memcpy(&out[i], &bits, 4);
    } else {
      out[i] = half_to_float(h);
    }
  }
}

// Buffers the model holds that are not parameters (GPT-2's causal mask).
bool is_buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
         name.ends_with("rotary_emb.inv_freq");
}

}  // namespace

ModelConfig hf_model_config(const std::string& config_json, const std::string& what) {
  const Json j = parse_json(config_json, what);
  if (j.kind != Json::Kind::object) throw ConfigError(what + ": not a JSON object");
  ConfigReader r(j, what);
  const std::string type = r.text("model_type", "");
  ModelConfig c;
  if (type == "gpt2") {
    c = model_preset(Arch::gpt2);
    c.vocab_size = r.integer("vocab_size");
    c.seq_len = r.integer("n_positions");
    c.d_model = r.integer("n_embd");
    c.n_layers = r.integer("n_layer");
    c.n_heads = r.integer("n_head");
    c.d_ff = r.integer("n_inner", 4 * std::max<int64_t>(1, c.d_model));
    const std::string act = r.text("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      r.problems.push_back("activation_function \"" + act +
                           "\": llmtrain's GELU is the tanh approximation (gelu_new)");
    c.norm_eps = r.real("layer_norm_epsilon", 1e-5f);
    c.dropout = r.real("resid_pdrop", 0.1f);
    c.init_std = r.real("initializer_range", 0.02f);
    c.tie_embeddings = r.flag("tie_word_embeddings", true);
    if (r.flag("scale_attn_by_inverse_layer_idx", false))
      r.problems.push_back("scale_attn_by_inverse_layer_idx true: llmtrain scales by 1/sqrt(D)");
    if (!r.flag("scale_attn_weights", true))
      r.problems.push_back("scale_attn_weights false: llmtrain scales by 1/sqrt(D)");
  } else if (type == "llama" || type == "mixtral") {
    c = model_preset(Arch::llama);
    c.vocab_size = r.integer("vocab_size");
    c.d_model = r.integer("hidden_size");
    c.n_layers = r.integer("num_hidden_layers");
    c.n_heads = r.integer("num_attention_heads");
    c.n_kv_heads = r.integer("num_key_value_heads", c.n_heads);
    c.seq_len = r.integer("max_position_embeddings");
    c.norm_eps = r.real("rms_norm_eps", 1e-6f);
    c.rope_theta = r.real("rope_theta", 10000.0f);
    c.init_std = r.real("initializer_range", 0.02f);
    c.tie_embeddings = r.flag("tie_word_embeddings", false);
    c.dropout = 0.0f;  // (Llama has no residual dropout, llmtrain's kind)
    const int64_t ffn = r.integer("intermediate_size");
    if (r.present("head_dim") && c.n_heads > 0 && r.integer("head_dim") * c.n_heads != c.d_model)
      r.problems.push_back(detail::concat("head_dim ", r.integer("head_dim"), " x ", c.n_heads,
                                          " heads is not hidden_size ", c.d_model,
                                          ": llmtrain's heads split d_model"));
    if (r.text("hidden_act", "silu") != "silu")
      r.problems.push_back("hidden_act \"" + r.text("hidden_act", "") +
                           "\": llmtrain's gated MLP is SwiGLU (silu)");
    read_rope_scaling(r, c, false);
    if (type == "llama") {
      c.d_ff = ffn;
      const bool attn_bias = r.flag("attention_bias", false), mlp_bias = r.flag("mlp_bias", false);
      if (attn_bias != mlp_bias)
        r.problems.push_back(
            "attention_bias and mlp_bias differ: llmtrain's model.bias covers both");
      c.bias = attn_bias;
    } else {
      c.bias = false;
      c.d_ff = ffn;
      c.moe.num_experts = r.integer("num_local_experts");
      c.moe.top_k = r.integer("num_experts_per_tok");
      c.moe.d_ff_expert = ffn;
      c.moe.router = MoeRouter::softmax;
      c.moe.normalize = true;
      c.moe.capacity_factor = 0;
      c.moe.aux_loss_coef = r.real("router_aux_loss_coef", 0.001f);
      if (r.present("sliding_window"))
        r.problems.push_back("sliding_window " + json_text(*r.get("sliding_window")) +
                             ": llmtrain's attention sees the whole context");
    }
  } else if (type == "deepseek_v3") {
    // DeepseekV3ForCausalLM: multi-head latent attention, the first first_k_dense_replace layers
    // dense, then sigmoid-scored experts chosen with the balancing bias, plus shared experts.
    c = model_preset(Arch::llama);
    c.attention = AttentionKind::mla;
    c.vocab_size = r.integer("vocab_size");
    c.d_model = r.integer("hidden_size");
    c.n_layers = r.integer("num_hidden_layers");
    c.n_heads = r.integer("num_attention_heads");
    c.n_kv_heads = c.n_heads;
    if (r.integer("num_key_value_heads", c.n_heads) != c.n_heads)
      r.problems.push_back(
          "num_key_value_heads differs from num_attention_heads: latent "
          "attention gives every head its own key and value");
    c.seq_len = r.integer("max_position_embeddings");
    c.d_ff = r.integer("intermediate_size");
    c.norm_eps = r.real("rms_norm_eps", 1e-6f);
    c.rope_theta = r.real("rope_theta", 10000.0f);
    c.init_std = r.real("initializer_range", 0.02f);
    c.tie_embeddings = r.flag("tie_word_embeddings", false);
    c.dropout = 0.0f;
    MlaConfig& a = c.mla;
    a.q_lora_rank = r.present("q_lora_rank") ? r.integer("q_lora_rank") : 0;
    a.kv_lora_rank = r.integer("kv_lora_rank");
    a.qk_nope_head_dim = r.integer("qk_nope_head_dim");
    a.qk_rope_head_dim = r.integer("qk_rope_head_dim");
    a.v_head_dim = r.integer("v_head_dim");
    // Multi-token prediction modules: layers num_hidden_layers .. + D - 1 of the weights.
    c.mtp_depth = r.count("num_nextn_predict_layers");
    const int64_t dense = r.count("first_k_dense_replace");
    if (dense < c.n_layers) {
      MoeConfig& e = c.moe;
      e.num_experts = r.present("n_routed_experts") ? r.integer("n_routed_experts")
                                                    : r.integer("num_local_experts");
      e.top_k = r.integer("num_experts_per_tok");
      e.d_ff_expert = r.integer("moe_intermediate_size");
      e.shared_experts = r.integer("n_shared_experts");
      e.d_ff_shared = e.d_ff_expert;
      e.router = MoeRouter::sigmoid;
      e.normalize = r.flag("norm_topk_prob", true);
      e.n_group = r.integer("n_group", 1);
      e.topk_group = r.integer("topk_group", e.n_group);
      e.routed_scaling_factor = r.real("routed_scaling_factor", 1.0f);
      e.balance = MoeBalance::bias;
      e.first_dense_layers = dense;
      e.capacity_factor = 0;
      if (r.integer("moe_layer_freq", 1) != 1)
        r.problems.push_back(
            "moe_layer_freq: llmtrain's DeepseekV3 layers are all MoE after the "
            "first first_k_dense_replace");
      if (r.text("scoring_func", "sigmoid") != "sigmoid")
        r.problems.push_back("scoring_func \"" + r.text("scoring_func", "") +
                             "\": DeepseekV3's router scores are sigmoids");
    }
    if (r.text("hidden_act", "silu") != "silu")
      r.problems.push_back("hidden_act \"" + r.text("hidden_act", "") +
                           "\": llmtrain's gated MLP is SwiGLU (silu)");
    if (r.flag("attention_bias", false))
      r.problems.push_back("attention_bias true: llmtrain's latent attention has no biases");
    read_rope_scaling(r, c, true);
    // transformers' default, and DeepSeek's released weights: the rope dims interleaved in the
    // q_b and kv_a rows, which llmtrain's rotate-half RoPE would read in another order.
    if (r.flag("rope_interleave", true))
      r.problems.push_back(
          "rope_interleave true (transformers' default): the weights' rope dims "
          "are interleaved, llmtrain's RoPE rotates halves; import does not "
          "permute them");
  } else {
    r.problems.push_back("model_type \"" + type +
                         "\": import reads gpt2 (GPT2LMHeadModel), llama (LlamaForCausalLM), "
                         "mixtral (MixtralForCausalLM) and deepseek_v3 (DeepseekV3ForCausalLM, "
                         "rope_interleave false)");
  }
  if (!r.problems.empty()) {
    std::string msg = what + ": cannot import this model into llmtrain:";
    for (const std::string& p : r.problems) msg += "\n  " + p;
    throw ConfigError(msg);
  }
  return c;
}

ImportResult import_safetensors(const std::string& hf_dir, const ModelConfig& cfg,
                                const RunState& state, const std::string& out) {
  LLMT_CHECK(state.mesh.world() == 1, "import writes one rank's checkpoint");
  const std::vector<HfTensor> mapping = hf_tensors(cfg);
  const ModelSpec spec = ModelSpec::from_config(cfg);
  std::map<std::string, StTensor> files = list_safetensors(hf_dir);
  // GPT-2 checkpoints saved from GPT2Model name tensors without the "transformer." prefix.
  auto lookup = [&](const std::string& name) -> const StTensor* {
    auto it = files.find(name);
    if (it == files.end() && name.starts_with("transformer."))
      it = files.find(name.substr(std::string("transformer.").size()));
    return it == files.end() ? nullptr : &it->second;
  };
  std::set<const StTensor*> used;
  std::set<std::string> dtypes;
  std::vector<std::string> problems;
  for (const HfTensor& t : mapping) {
    const StTensor* st = lookup(t.name);
    if (!st) {
      problems.push_back(t.name + ": missing from the safetensors files");
    } else if (st->shape != t.shape) {
      std::string have, want;
      for (int64_t d : st->shape) have += detail::concat(have.empty() ? "" : ", ", d);
      for (int64_t d : t.shape) want += detail::concat(want.empty() ? "" : ", ", d);
      problems.push_back(t.name + ": shape (" + have + "), the config gives (" + want + ")");
    }
  }
  if (!problems.empty()) {
    std::string msg = "Hugging Face weights in " + hf_dir + " do not fit their config:";
    for (const std::string& p : problems) msg += "\n  " + p;
    throw Error(msg);
  }

  ImportResult r;
  write_directory(out, "import", [&](const fs::path& tmp) {
    ShardFileWriter writer((tmp / rank_file_name(0)).string(), 0, state.step);
    std::vector<float> global, piece, rows;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const ParamSpec& p = spec.params[i];
      const std::string path = tensor_path(kMasterState, p.name);
      const Box full = whole(p.global_shape);
      global.assign(static_cast<size_t>(full.numel()), std::numeric_limits<float>::quiet_NaN());
      int64_t covered = 0;
      for (const HfTensor& t : mapping) {
        if (t.source != path) continue;
        const StTensor& st = *lookup(t.name);
        used.insert(&st);
        if (t.copy) continue;  // (present and shaped as checked above; the first is read)
        dtypes.insert(st.dtype);
        read_tensor(st, t.name, piece);
        const float* data = piece.data();
        if (t.transpose) {  // HF (K, R) -> our (R, K)
          const int64_t K = t.shape[0], R = t.shape[1];
          rows.resize(piece.size());
          for (int64_t a = 0; a < K; ++a)
            for (int64_t b = 0; b < R; ++b) rows[b * K + a] = piece[a * R + b];
          data = rows.data();
        }
        // Place the box (t.start, t.count) of the global tensor, row-major runs of its last dim.
        const size_t nd = t.count.size();
        const int64_t run = t.count[nd - 1], runs = static_cast<int64_t>(piece.size()) / run;
        for (int64_t k = 0; k < runs; ++k) {
          int64_t rem = k, off = 0, stride = 1;
          std::vector<int64_t> idx(nd, 0);
          for (size_t d = nd - 1; d-- > 0;) {
            idx[d] = rem % t.count[d];
            rem /= t.count[d];
          }
          for (size_t d = nd; d-- > 0;) {
            off += (t.start[d] + idx[d]) * stride;
            stride *= full.count[d];
          }
          std::memcpy(global.data() + off, data + k * run, static_cast<size_t>(run) * 4);
        }
        covered += static_cast<int64_t>(piece.size());
        ++r.tensors;
      }
      if (covered != full.numel())
        throw Error(detail::concat(path, ": the Hugging Face tensors cover ", covered, " of its ",
                                   full.numel(), " elements"));
      writer.write(shard_dataset(kMasterState, p.name, 0), full, global.data());
      r.parameters += full.numel();
    }
    writer.close();
    r.bytes = writer.bytes_written();
    const WriteLayout layout{};  // one rank
    write_index(tmp.string(), state, plan_index(spec, layout, {kMasterState}));
    write_manifest_of(tmp.string(), state.step, 1);
  });
  for (const std::string& d : dtypes) r.dtypes += (r.dtypes.empty() ? "" : ", ") + d;
  for (const auto& [name, st] : files)
    if (!used.count(&st) && !is_buffer(name) && !(cfg.tie_embeddings && name == "lm_head.weight"))
      r.unused.push_back(name);
  return r;
}

}  // namespace llmt::ckpt

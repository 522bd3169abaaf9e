#include "checkpoints/export.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>

#include "checkpoints/h5.h"
#include "core/check.h"
#include "engine/model/model_spec.h"

namespace llmt::ckpt {

namespace fs = std::filesystem;
static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this writer copies host floats as they are");

namespace {

std::vector<int64_t> dims(const Shape& s) {
  return whole(s).count;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "(";
  for (size_t i = 0; i < s.size(); ++i) t += detail::concat(i ? ", " : "", s[i]);
  return t + (s.size() == 1 ? ",)" : ")");
}

// "wte.weight" of "model/wte.weight".
std::string param_name(const std::string& path) {
  return path.substr(path.find('/') + 1);
}

// Every [model] value the target class cannot represent, one message each.
std::vector<std::string> unrepresentable(const ModelConfig& c) {
  std::vector<std::string> p;
  const int64_t kv = c.n_kv_heads > 0 ? c.n_kv_heads : c.n_heads;
  if (c.arch == Arch::gpt2) {
    if (c.mla_attention())
      p.push_back(
          "model.attention=\"mla\": GPT-2 has multi-head attention (latent attention "
          "exports as DeepseekV3 with model.arch=\"llama\")");
    if (c.norm != NormKind::layernorm)
      p.push_back("model.norm=\"rmsnorm\": GPT-2's norms are LayerNorm (weight and bias)");
    if (c.activation != Activation::gelu)
      p.push_back("model.activation=\"swiglu\": GPT-2's MLP is c_fc, gelu_new, c_proj (no gate)");
    if (c.position != PositionKind::learned)
      p.push_back("model.position=\"rope\": GPT-2 has a learned position table (wpe), no RoPE");
    if (!c.bias) p.push_back("model.bias=false: GPT-2's Conv1D layers always have a bias");
    if (kv != c.n_heads)
      p.push_back(detail::concat("model.n_kv_heads=", kv, " with model.n_heads=", c.n_heads,
                                 ": GPT-2 has no grouped-query attention"));
  } else if (c.mla_attention()) {
    // DeepseekV3: sigmoid scores, selection with e_score_correction_bias (aux-loss-free
    // balancing's bias), the first layers dense, shared experts as wide as the routed ones.
    const MoeConfig& e = c.moe;
    if (e.enabled()) {
      if (e.router != MoeRouter::sigmoid)
        p.push_back("model.moe.router=\"softmax\": DeepseekV3's router scores are sigmoids");
      if (e.balance != MoeBalance::bias)
        p.push_back(
            "model.moe.balance: DeepseekV3 selects experts with its "
            "e_score_correction_bias, aux-loss-free balancing's bias (balance = \"bias\")");
      if (e.shared_experts < 1)
        p.push_back("model.moe.shared_experts=0: every DeepseekV3 MoE layer has shared experts");
      if (e.d_ff_shared != e.d_ff_expert)
        p.push_back(detail::concat("model.moe.d_ff_shared=", e.d_ff_shared,
                                   " with model.moe.d_ff_expert=", e.d_ff_expert,
                                   ": DeepseekV3's shared experts are as wide as its routed ones"));
      if (e.every > 1)
        p.push_back(detail::concat("model.moe.every=", e.every,
                                   ": every DeepseekV3 layer after the first dense ones is MoE"));
      if (e.capacity_factor > 0)
        p.push_back(detail::concat("model.moe.capacity_factor=", e.capacity_factor,
                                   ": DeepseekV3 runs every routed token (dropless)"));
    }
  } else {
    if (c.moe.enabled()) {
      // Mixtral: every layer a dropless softmax top-k mixture with normalized weights.
      const MoeConfig& e = c.moe;
      if (e.router != MoeRouter::softmax)
        p.push_back("model.moe.router=\"sigmoid\": Mixtral's router is a softmax over the experts");
      if (!e.normalize)
        p.push_back("model.moe.normalize=false: Mixtral divides the top-k weights by their sum");
      if (e.shared_experts > 0)
        p.push_back(detail::concat("model.moe.shared_experts=", e.shared_experts,
                                   ": Mixtral has no shared experts"));
      if (e.groups_picked() < e.n_group)
        p.push_back(detail::concat("model.moe.topk_group=", e.topk_group, " of model.moe.n_group=",
                                   e.n_group, ": Mixtral's router picks from every expert"));
      if (e.routed_scaling_factor != 1.0f)
        p.push_back(detail::concat("model.moe.routed_scaling_factor=", e.routed_scaling_factor,
                                   ": Mixtral's routing weights are not scaled"));
      if (e.first_dense_layers > 0 || e.every > 1)
        p.push_back(detail::concat("model.moe.first_dense_layers=", e.first_dense_layers,
                                   ", model.moe.every=", e.every,
                                   ": every Mixtral layer is a mixture of experts"));
      if (e.capacity_factor > 0)
        p.push_back(detail::concat("model.moe.capacity_factor=", e.capacity_factor,
                                   ": Mixtral runs every routed token (dropless); its outputs "
                                   "would differ from the trained model's"));
      if (c.bias) p.push_back("model.bias=true: Mixtral's linears have no bias");
    }
  }
  if (c.mtp_depth > 0 && (c.arch == Arch::gpt2 || !c.mla_attention()))
    p.push_back(detail::concat("model.mtp_depth=", c.mtp_depth, ": ", hf_class(c),
                               " has no multi-token prediction modules (DeepseekV3, "
                               "model.attention=\"mla\", stores them as extra layers)"));
  if (c.arch != Arch::gpt2) {
    if (c.norm != NormKind::rmsnorm)
      p.push_back("model.norm=\"layernorm\": Llama's norms are RMSNorm (weight only, no bias)");
    if (c.activation != Activation::swiglu)
      p.push_back("model.activation=\"gelu\": Llama's MLP is gated: down(silu(gate(x)) * up(x))");
    if (c.position != PositionKind::rope)
      p.push_back("model.position=\"learned\": Llama has RoPE and no position table");
    if (!c.mla_attention() && c.rope_scaling.rope_type == RopeType::yarn &&
        c.rope_scaling.mscale_all_dim != 0.0f)
      p.push_back(
          "model.rope_scaling.mscale_all_dim: transformers' LlamaAttention does not scale the "
          "scores by YaRN's m(factor, mscale_all_dim)^2 (DeepseekV3's latent attention does)");
  }
  return p;
}

void require_representable(const ModelConfig& c) {
  const std::vector<std::string> p = unrepresentable(c);
  if (p.empty()) return;
  std::string msg = detail::concat("cannot export to Hugging Face ", hf_class(c), " (model.arch=\"",
                                   c.arch == Arch::gpt2 ? "gpt2" : "llama", "\"):");
  for (const std::string& s : p) msg += "\n  " + s;
  throw ConfigError(msg);
}

// Builds the list from (HF name, our parameter name[, row range], transpose), shapes from the
// spec's global shapes.
class Builder {
 public:
  explicit Builder(const ModelSpec& spec) : spec_(spec) {}
  void add(const std::string& hf, const std::string& ours, bool transpose = false) {
    const Shape& s = spec_.params[spec_.index_of(ours)].global_shape;
    add_rows(hf, ours, 0, s[0], transpose);
  }
  void add_rows(const std::string& hf, const std::string& ours, int64_t row_begin, int64_t row_end,
                bool transpose = false) {
    std::vector<int64_t> start(dims(spec_.params[spec_.index_of(ours)].global_shape).size(), 0);
    std::vector<int64_t> count = dims(spec_.params[spec_.index_of(ours)].global_shape);
    start[0] = row_begin;
    count[0] = row_end - row_begin;
    add_box(hf, ours, start, count, count, transpose);
  }
  // Rows [row_begin, row_end) of expert e's matrix in a stack (E, rows, cols), as a matrix.
  void add_expert_rows(const std::string& hf, const std::string& ours, int64_t e, int64_t row_begin,
                       int64_t row_end) {
    const std::vector<int64_t> g = dims(spec_.params[spec_.index_of(ours)].global_shape);
    add_box(hf, ours, {e, row_begin, 0}, {1, row_end - row_begin, g[2]},
            {row_end - row_begin, g[2]}, false);
  }
  // hf as a copy of `ours`, whole (HfTensor::copy).
  void add_copy(const std::string& hf, const std::string& ours) {
    add(hf, ours);
    out_.back().copy = true;
  }
  std::vector<HfTensor> take() { return std::move(out_); }

 private:
  void add_box(const std::string& hf, const std::string& ours, std::vector<int64_t> start,
               std::vector<int64_t> count, std::vector<int64_t> shape, bool transpose) {
    HfTensor t;
    t.name = hf;
    t.source = tensor_path(kMasterState, ours);
    t.shape = std::move(shape);
    t.start = std::move(start);
    t.count = std::move(count);
    t.transpose = transpose;
    if (transpose) std::swap(t.shape[0], t.shape[1]);
    out_.push_back(std::move(t));
  }

  const ModelSpec& spec_;
  std::vector<HfTensor> out_;
};

void gpt2_tensors(const ModelSpec& spec, Builder& m) {
  const bool conv1d = true;  // HF Conv1D weights are (in, out): our (out, in) transposed
  m.add("transformer.wte.weight", "wte.weight");
  m.add("transformer.wpe.weight", "wpe.weight");
  for (int64_t l = 0; l < spec.cfg.n_layers; ++l) {
    const std::string h = detail::concat("transformer.h.", l, "."),
                      o = detail::concat("layers.", l, ".");
    m.add(h + "ln_1.weight", o + "norm_1.weight");
    m.add(h + "ln_1.bias", o + "norm_1.bias");
    m.add(h + "attn.c_attn.weight", o + "attn.qkv.weight", conv1d);
    m.add(h + "attn.c_attn.bias", o + "attn.qkv.bias");
    m.add(h + "attn.c_proj.weight", o + "attn.proj.weight", conv1d);
    m.add(h + "attn.c_proj.bias", o + "attn.proj.bias");
    m.add(h + "ln_2.weight", o + "norm_2.weight");
    m.add(h + "ln_2.bias", o + "norm_2.bias");
    m.add(h + "mlp.c_fc.weight", o + "mlp.fc1.weight", conv1d);
    m.add(h + "mlp.c_fc.bias", o + "mlp.fc1.bias");
    m.add(h + "mlp.c_proj.weight", o + "mlp.fc2.weight", conv1d);
    m.add(h + "mlp.c_proj.bias", o + "mlp.fc2.bias");
  }
  m.add("transformer.ln_f.weight", "norm_f.weight");
  m.add("transformer.ln_f.bias", "norm_f.bias");
  if (!spec.cfg.tie_embeddings) m.add("lm_head.weight", "lm_head.weight");
}

void llama_tensors(const ModelSpec& spec, Builder& m) {
  const int64_t q = spec.cfg.n_heads * spec.head_dim, kv = spec.n_kv_heads * spec.head_dim;
  const int64_t F = spec.ffn_dim;
  const bool bias = spec.cfg.bias;
  m.add("model.embed_tokens.weight", "wte.weight");
  for (int64_t l = 0; l < spec.cfg.n_layers; ++l) {
    const std::string h = detail::concat("model.layers.", l, "."),
                      o = detail::concat("layers.", l, ".");
    m.add(h + "input_layernorm.weight", o + "norm_1.weight");
    // qkv rows [q heads (H*D) | k heads (KV*D) | v heads (KV*D)].
    for (const std::string w : {"weight", "bias"}) {
      if (w == "bias" && !bias) continue;
      const std::string src = o + "attn.qkv." + w;
      m.add_rows(h + "self_attn.q_proj." + w, src, 0, q);
      m.add_rows(h + "self_attn.k_proj." + w, src, q, q + kv);
      m.add_rows(h + "self_attn.v_proj." + w, src, q + kv, q + 2 * kv);
    }
    m.add(h + "self_attn.o_proj.weight", o + "attn.proj.weight");
    if (bias) m.add(h + "self_attn.o_proj.bias", o + "attn.proj.bias");
    m.add(h + "post_attention_layernorm.weight", o + "norm_2.weight");
    if (spec.cfg.moe.enabled()) {
      // Mixtral: the router is the gate; expert e's w1 (gate), w3 (up) are its fc1 rows
      // [gate | up], w2 (down) its fc2.
      const std::string x = h + "block_sparse_moe.";
      const int64_t Fe = spec.cfg.moe.d_ff_expert;
      m.add(x + "gate.weight", o + "mlp.router.weight");
      for (int64_t e = 0; e < spec.cfg.moe.num_experts; ++e) {
        const std::string xe = detail::concat(x, "experts.", e, ".");
        m.add_expert_rows(xe + "w1.weight", o + "mlp.experts.fc1.weight", e, 0, Fe);
        m.add_expert_rows(xe + "w2.weight", o + "mlp.experts.fc2.weight", e, 0, spec.cfg.d_model);
        m.add_expert_rows(xe + "w3.weight", o + "mlp.experts.fc1.weight", e, Fe, 2 * Fe);
      }
      continue;
    }
    // fc1 rows [gate (F) | up (F)].
    for (const std::string w : {"weight", "bias"}) {
      if (w == "bias" && !bias) continue;
      const std::string src = o + "mlp.fc1." + w;
      m.add_rows(h + "mlp.gate_proj." + w, src, 0, F);
      m.add_rows(h + "mlp.up_proj." + w, src, F, 2 * F);
    }
    m.add(h + "mlp.down_proj.weight", o + "mlp.fc2.weight");
    if (bias) m.add(h + "mlp.down_proj.bias", o + "mlp.fc2.bias");
  }
  m.add("model.norm.weight", "norm_f.weight");
  if (!spec.cfg.tie_embeddings) m.add("lm_head.weight", "lm_head.weight");
}

// DeepseekV3ForCausalLM (transformers' modeling_deepseek_v3): multi-head latent attention under
// its own names, dense MLPs as Llama's, MoE layers' router as the gate (with the balancing bias
// as e_score_correction_bias), experts as Mixtral's rows, the shared experts one gated MLP.
void deepseek_v3_tensors(const ModelSpec& spec, Builder& m) {
  const ModelConfig& c = spec.cfg;
  const int64_t F = spec.ffn_dim;
  m.add("model.embed_tokens.weight", "wte.weight");
  // The multi-token prediction modules are layers L .. L + D - 1, as in DeepSeek's released
  // weights, which also store the embedding and head again under each (copies here).
  for (int64_t l = 0; l < c.n_layers + c.mtp_depth; ++l) {
    const std::string h = detail::concat("model.layers.", l, "."),
                      o = detail::concat("layers.", l, ".");
    if (l >= c.n_layers) {
      m.add_copy(h + "embed_tokens.weight", "wte.weight");
      m.add(h + "enorm.weight", o + "mtp.enorm.weight");
      m.add(h + "hnorm.weight", o + "mtp.hnorm.weight");
      m.add(h + "eh_proj.weight", o + "mtp.eh_proj.weight");
      m.add(h + "shared_head.norm.weight", o + "mtp.norm.weight");
      m.add_copy(h + "shared_head.head.weight", c.tie_embeddings ? "wte.weight" : "lm_head.weight");
    }
    m.add(h + "input_layernorm.weight", o + "norm_1.weight");
    const std::string a = h + "self_attn.";
    if (c.mla.q_lora_rank > 0) {
      m.add(a + "q_a_proj.weight", o + "attn.q_a.weight");
      m.add(a + "q_a_layernorm.weight", o + "attn.q_a_norm.weight");
      m.add(a + "q_b_proj.weight", o + "attn.q_b.weight");
    } else {
      m.add(a + "q_proj.weight", o + "attn.q.weight");
    }
    m.add(a + "kv_a_proj_with_mqa.weight", o + "attn.kv_a.weight");
    m.add(a + "kv_a_layernorm.weight", o + "attn.kv_a_norm.weight");
    m.add(a + "kv_b_proj.weight", o + "attn.kv_b.weight");
    m.add(a + "o_proj.weight", o + "attn.proj.weight");
    m.add(h + "post_attention_layernorm.weight", o + "norm_2.weight");
    // A gated MLP of width W from fc1 rows [gate | up] and fc2.
    auto gated = [&](const std::string& hf, const std::string& ours, int64_t W) {
      m.add_rows(hf + "gate_proj.weight", ours + "fc1.weight", 0, W);
      m.add_rows(hf + "up_proj.weight", ours + "fc1.weight", W, 2 * W);
      m.add(hf + "down_proj.weight", ours + "fc2.weight");
    };
    if (!c.moe.layer(l)) {
      gated(h + "mlp.", o + "mlp.", F);
      continue;
    }
    const int64_t Fe = c.moe.d_ff_expert;
    m.add(h + "mlp.gate.weight", o + "mlp.router.weight");
    m.add(h + "mlp.gate.e_score_correction_bias", o + "mlp.router.expert_bias");
    for (int64_t e = 0; e < c.moe.num_experts; ++e) {
      const std::string xe = detail::concat(h, "mlp.experts.", e, ".");
      m.add_expert_rows(xe + "gate_proj.weight", o + "mlp.experts.fc1.weight", e, 0, Fe);
      m.add_expert_rows(xe + "up_proj.weight", o + "mlp.experts.fc1.weight", e, Fe, 2 * Fe);
      m.add_expert_rows(xe + "down_proj.weight", o + "mlp.experts.fc2.weight", e, 0, c.d_model);
    }
    gated(h + "mlp.shared_experts.", o + "mlp.shared.", spec.shared_ffn);
  }
  m.add("model.norm.weight", "norm_f.weight");
  if (!c.tie_embeddings) m.add("lm_head.weight", "lm_head.weight");
}

// The shortest decimal that reads back as the same float, as a JSON number ("1e-05", "0.02",
// "10000.0").
std::string json_number(float v) {
  char buf[32];
  if (v == std::floor(v) && std::fabs(v) < 1e15f) {  // a whole number as such: "10000.0"
    std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(v));
    return buf;
  }
  for (int p = 1; p <= 9; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

const char* json_bool(bool b) {
  return b ? "true" : "false";
}

// [model.rope_scaling] as config.json's rope_scaling: null, or the keys Hugging Face reads for its
// rope_type (kernels/rope_math.h).
std::string rope_scaling_json(const RopeScaling& s) {
  if (s.rope_type == RopeType::none) return "null";
  std::string out;
  auto key = [&out](const char* k, const std::string& v) {
    out += detail::concat(out.empty() ? "{" : ", ", "\"", k, "\": ", v);
  };
  const char* type = s.rope_type == RopeType::linear   ? "linear"
                     : s.rope_type == RopeType::llama3 ? "llama3"
                                                       : "yarn";
  key("rope_type", detail::concat("\"", type, "\""));
  key("factor", json_number(s.factor));
  if (s.rope_type == RopeType::llama3) {
    key("low_freq_factor", json_number(s.low_freq_factor));
    key("high_freq_factor", json_number(s.high_freq_factor));
  }
  if (s.rope_type != RopeType::linear)
    key("original_max_position_embeddings", std::to_string(s.original_max_position_embeddings));
  if (s.rope_type == RopeType::yarn) {
    key("beta_fast", json_number(s.beta_fast));
    key("beta_slow", json_number(s.beta_slow));
    key("mscale", json_number(s.mscale));
    key("mscale_all_dim", json_number(s.mscale_all_dim));
    if (s.attention_factor > 0.0f) key("attention_factor", json_number(s.attention_factor));
  }
  return out + "}";
}

// A file written whole or reported with its path; closed on scope exit.
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File create(const fs::path& path) {
  File f(std::fopen(path.c_str(), "wb"));
  if (!f) throw Error("cannot create " + path.string());
  return f;
}

void write_all(std::FILE* f, const void* data, size_t bytes, const fs::path& path) {
  if (bytes > 0 && std::fwrite(data, 1, bytes, f) != bytes)
    throw Error("writing " + path.string() + " failed (disk full?)");
}

void finish(File f, const fs::path& path) {
  if (std::fclose(f.release()) != 0) throw Error("closing " + path.string() + " failed");
  h5::fsync_path(path.string());
}

// The checkpoint tensors the export reads exist with the shapes `cfg` gives them.
void check_sources(const Checkpoint& ckpt, const ModelSpec& spec,
                   const std::vector<HfTensor>& tensors) {
  std::vector<std::string> problems;
  std::set<std::string> seen;
  for (const HfTensor& t : tensors) {
    if (!seen.insert(t.source).second) continue;
    const std::vector<int64_t> want =
        dims(spec.params[spec.index_of(param_name(t.source))].global_shape);
    const IndexTensor* it = ckpt.find(t.source);
    if (!it)
      problems.push_back(t.source + ": missing from the checkpoint");
    else if (it->shape != want)
      problems.push_back(detail::concat(t.source, ": the checkpoint has shape ",
                                        shape_text(it->shape), ", its [model] config gives ",
                                        shape_text(want)));
  }
  if (problems.empty()) return;
  std::string msg = "checkpoint " + ckpt.dir() + " does not hold the model its config describes:";
  for (const std::string& p : problems) msg += "\n  " + p;
  throw Error(msg);
}

}  // namespace

const char* hf_class(const ModelConfig& cfg) {
  if (cfg.arch == Arch::gpt2) return "GPT2LMHeadModel";
  if (cfg.mla_attention()) return "DeepseekV3ForCausalLM";
  return cfg.moe.enabled() ? "MixtralForCausalLM" : "LlamaForCausalLM";
}

std::vector<HfTensor> hf_tensors(const ModelConfig& cfg) {
  require_representable(cfg);
  const ModelSpec spec = ModelSpec::from_config(cfg);
  Builder m(spec);
  if (cfg.arch == Arch::gpt2)
    gpt2_tensors(spec, m);
  else if (cfg.mla_attention())
    deepseek_v3_tensors(spec, m);
  else
    llama_tensors(spec, m);
  return m.take();
}

std::string hf_config_json(const ModelConfig& cfg, const HfTokenizer& tokenizer) {
  require_representable(cfg);
  const ModelSpec spec = ModelSpec::from_config(cfg);
  const ModelConfig& c = spec.cfg;
  std::string s = "{";
  auto field = [&s](const char* key, const std::string& json_value) {
    s += detail::concat(s.size() > 1 ? ",\n" : "\n", "  \"", key, "\": ", json_value);
  };
  auto num = [](int64_t v) { return std::to_string(v); };
  field("architectures", std::string("[\"") + hf_class(c) + "\"]");
  if (c.arch == Arch::gpt2) {
    field("model_type", "\"gpt2\"");
    field("vocab_size", num(c.vocab_size));
    field("n_positions", num(c.seq_len));
    field("n_embd", num(c.d_model));
    field("n_layer", num(c.n_layers));
    field("n_head", num(c.n_heads));
    field("n_inner", num(spec.ffn_dim));
    field("activation_function", "\"gelu_new\"");
    field("layer_norm_epsilon", json_number(c.norm_eps));
    // Our dropout is on the residual branches only.
    field("resid_pdrop", json_number(c.dropout));
    field("embd_pdrop", "0.0");
    field("attn_pdrop", "0.0");
    field("scale_attn_weights", "true");
    field("scale_attn_by_inverse_layer_idx", "false");
    field("reorder_and_upcast_attn", "false");
  } else if (c.mla_attention()) {
    // DeepSeek's released config.json keys; RoPE rotate-half (rope_interleave false: llmtrain's
    // layout, where DeepSeek's released weights interleave the rope dims).
    const MoeConfig& e = c.moe;
    const MlaConfig& a = c.mla;
    field("model_type", "\"deepseek_v3\"");
    field("vocab_size", num(c.vocab_size));
    field("hidden_size", num(c.d_model));
    field("intermediate_size", num(spec.ffn_dim));
    field("moe_intermediate_size", num(e.enabled() ? e.d_ff_expert : spec.ffn_dim));
    field("num_hidden_layers", num(c.n_layers));
    field("num_attention_heads", num(c.n_heads));
    field("num_key_value_heads", num(c.n_heads));
    field("n_shared_experts", num(e.enabled() ? e.shared_experts : 1));
    field("n_routed_experts", num(e.enabled() ? e.num_experts : 1));
    field("routed_scaling_factor", json_number(e.enabled() ? e.routed_scaling_factor : 1.0f));
    field("kv_lora_rank", num(a.kv_lora_rank));
    field("q_lora_rank", a.q_lora_rank > 0 ? num(a.q_lora_rank) : std::string("null"));
    field("qk_rope_head_dim", num(a.qk_rope_head_dim));
    field("v_head_dim", num(a.v_head_dim));
    field("qk_nope_head_dim", num(a.qk_nope_head_dim));
    field("head_dim", num(a.qk_rope_head_dim));
    field("n_group", num(e.enabled() ? e.n_group : 1));
    field("topk_group", num(e.enabled() ? e.groups_picked() : 1));
    field("num_experts_per_tok", num(e.enabled() ? e.top_k : 1));
    // Layers before this one are dense (all of them without experts).
    field("first_k_dense_replace", num(e.enabled() ? e.first_dense_layers : c.n_layers));
    field("norm_topk_prob", json_bool(!e.enabled() || e.normalize));
    field("scoring_func", "\"sigmoid\"");
    field("topk_method", "\"noaux_tc\"");
    field("hidden_act", "\"silu\"");
    field("max_position_embeddings", num(c.seq_len));
    field("rms_norm_eps", json_number(c.norm_eps));
    field("rope_theta", json_number(c.rope_theta));
    field("rope_scaling", rope_scaling_json(c.rope_scaling));
    field("rope_interleave", "false");
    field("attention_bias", "false");
    field("attention_dropout", "0.0");
    field("num_nextn_predict_layers", num(c.mtp_depth));
  } else {
    const bool mixtral = c.moe.enabled();
    field("model_type", mixtral ? "\"mixtral\"" : "\"llama\"");
    field("vocab_size", num(c.vocab_size));
    field("hidden_size", num(c.d_model));
    field("intermediate_size", num(mixtral ? c.moe.d_ff_expert : spec.ffn_dim));
    if (mixtral) {
      field("num_local_experts", num(c.moe.num_experts));
      field("num_experts_per_tok", num(c.moe.top_k));
      field("router_aux_loss_coef", json_number(c.moe.aux_loss_coef));
      field("output_router_logits", "false");
      field("sliding_window", "null");
    }
    field("num_hidden_layers", num(c.n_layers));
    field("num_attention_heads", num(c.n_heads));
    field("num_key_value_heads", num(spec.n_kv_heads));
    field("head_dim", num(spec.head_dim));
    field("hidden_act", "\"silu\"");
    field("max_position_embeddings", num(c.seq_len));
    field("rms_norm_eps", json_number(c.norm_eps));
    field("rope_theta", json_number(c.rope_theta));
    field("rope_scaling", rope_scaling_json(c.rope_scaling));
    if (!mixtral) {
      field("attention_bias", json_bool(c.bias));
      field("mlp_bias", json_bool(c.bias));
    }
    field("attention_dropout", "0.0");
    field("pretraining_tp", "1");
  }
  field("initializer_range", json_number(c.init_std));
  field("tie_word_embeddings", json_bool(c.tie_embeddings));
  // The tokenizer's special tokens, when the export was given the tokenizer.
  auto id = [&](int32_t v) { return v >= 0 ? num(v) : std::string("null"); };
  field("bos_token_id", id(tokenizer.bos_id));
  field("eos_token_id", id(tokenizer.eos_id));
  field("use_cache", "true");
  field("torch_dtype", "\"float32\"");
  return s + "\n}\n";
}

std::string safetensors_header(const std::vector<HfTensor>& tensors) {
  std::string json = "{\"__metadata__\":{\"format\":\"pt\"}";
  int64_t offset = 0;
  for (const HfTensor& t : tensors) {
    int64_t numel = 1;
    std::string shape;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      numel *= t.shape[d];
      shape += detail::concat(d ? "," : "", t.shape[d]);
    }
    const int64_t end = offset + 4 * numel;
    json += detail::concat(",\"", t.name, "\":{\"dtype\":\"F32\",\"shape\":[", shape,
                           "],\"data_offsets\":[", offset, ",", end, "]}");
    offset = end;
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int b = 0; b < 8; ++b) out[b] = static_cast<char>((n >> (8 * b)) & 0xff);
  return out + json;
}

std::string write_directory(const std::string& out_arg, const std::string& what,
                            const std::function<void(const fs::path& tmp)>& fill) {
  fs::path out = fs::path(out_arg).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "OUT/"
  if (fs::exists(out))
    throw ConfigError(what + " output " + out.string() +
                      " already exists: remove it or give a new directory");
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  const fs::path tmp = parent / (".tmp." + out.filename().string());
  fs::create_directories(parent);
  fs::remove_all(tmp);  // an interrupted run's leftovers
  fs::create_directory(tmp);
  try {
    fill(tmp);
    h5::fsync_path(tmp.string());
    fs::rename(tmp, out);
    h5::fsync_path(parent.string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  return out.string();
}

ToolMemory export_memory(const Checkpoint& ckpt, const ModelConfig& cfg) {
  ToolMemory out;
  for (const HfTensor& t : hf_tensors(cfg)) {
    int64_t n = 1;
    for (int64_t c : t.count) n *= c;
    const int64_t bytes = n * 4 * (t.transpose ? 2 : 1);
    if (bytes > out.bytes)
      out = {bytes, detail::concat("the largest tensor written, ", t.name, " (", n, " elements",
                                   t.transpose ? ", read and transposed)" : ")")};
  }
  const ToolMemory read = verify_memory(ckpt);
  out.bytes += read.bytes;
  out.what += ", and " + read.what;
  return out;
}

ExportResult export_safetensors(const Checkpoint& ckpt, const ModelConfig& cfg,
                                const std::string& out_arg, const HfTokenizer& tokenizer) {
  const std::vector<HfTensor> tensors = hf_tensors(cfg);
  const std::string config_json = hf_config_json(cfg, tokenizer);
  const ModelSpec spec = ModelSpec::from_config(cfg);
  check_sources(ckpt, spec, tensors);
  ExportResult r;
  r.dir = write_directory(out_arg, "export", [&](const fs::path& tmp) {
    {
      const fs::path path = tmp / "config.json";
      File f = create(path);
      write_all(f.get(), config_json.data(), config_json.size(), path);
      finish(std::move(f), path);
    }
    for (const auto& [name, contents] : tokenizer.files) {
      const fs::path path = tmp / name;
      File f = create(path);
      write_all(f.get(), contents.data(), contents.size(), path);
      finish(std::move(f), path);
    }
    const fs::path path = tmp / "model.safetensors";
    File f = create(path);
    const std::string header = safetensors_header(tensors);
    write_all(f.get(), header.data(), header.size(), path);
    r.file_bytes = static_cast<int64_t>(header.size());
    std::vector<float> rows, transposed;  // one tensor at a time
    for (const HfTensor& t : tensors) {
      Box box = whole(spec.params[spec.index_of(param_name(t.source))].global_shape);
      box.start = t.start;
      box.count = t.count;
      rows.resize(static_cast<size_t>(box.numel()));
      ckpt.read(t.source, box, rows.data());
      const float* data = rows.data();
      if (t.transpose) {  // (R, K) -> (K, R)
        const int64_t R = t.shape[1], K = t.shape[0];
        transposed.resize(rows.size());
        for (int64_t i = 0; i < R; ++i)
          for (int64_t j = 0; j < K; ++j) transposed[j * R + i] = rows[i * K + j];
        data = transposed.data();
      }
      write_all(f.get(), data, rows.size() * sizeof(float), path);
      r.file_bytes += static_cast<int64_t>(rows.size() * sizeof(float));
      r.param_count += box.numel();
      ++r.tensors;
    }
    finish(std::move(f), path);
  });
  return r;
}

}  // namespace llmt::ckpt

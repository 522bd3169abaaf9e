// Strict TOML -> Config. One table (sections()) lists every key of every section with the member
// it fills; reading, printing, did-you-mean suggestions (config's Loader, through the
// schema made from it) and --set resolution all go through it, so adding a key is one line there.
// A run is: load files (includes first, the including file wins key by key) and --set overrides
// -> read typed values -> fill presets and derived defaults -> check every rule: each component
// checks its own section (check_*_config next to its *_config.h), this file the [train] and
// [log] rules. Each stage reports all of its problems at once.
#include "train/config.h"

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <set>
#include <type_traits>

#include "config/loader.h"
#include "config/rules.h"
#include "core/check.h"

namespace llmt {
namespace {

namespace fs = std::filesystem;
using detail::concat;

// Accepted spellings of each enum, indexed by the enum's value.
constexpr std::array<std::string_view, 2> kArchNames{"gpt2", "llama"};
constexpr std::array<std::string_view, 2> kNormNames{"layernorm", "rmsnorm"};
constexpr std::array<std::string_view, 2> kActivationNames{"gelu", "swiglu"};
constexpr std::array<std::string_view, 2> kPositionNames{"learned", "rope"};
constexpr std::array<std::string_view, 3> kDecayNames{"cosine", "linear", "constant"};
constexpr std::array<std::string_view, 2> kOptimizerTypeNames{"adamw", "muon"};
constexpr std::array<std::string_view, 3> kPrecisionNames{"fp32", "bf16", "fp16"};
constexpr std::array<std::string_view, 3> kRecomputeNames{"none", "selective", "full"};
constexpr std::array<std::string_view, 5> kRecomputeModuleNames{"core_attn", "layernorm", "act",
                                                                "moe_act", "mla_up_proj"};
constexpr std::array<std::string_view, 2> kOnNonfiniteNames{"stop", "skip"};
constexpr std::array<std::string_view, 2> kGradDTypeNames{"fp32", "compute"};
constexpr std::array<std::string_view, 3> kFp8Names{"none", "tensorwise", "blockwise"};
constexpr std::array<std::string_view, 2> kSourceNames{"synthetic", "indexed"};
constexpr std::array<std::string_view, 3> kDeviceNames{"auto", "cpu", "cuda"};
constexpr std::array<std::string_view, 6> kScheduleNames{"gpipe", "1f1b", "interleaved",
                                                         "zb-h1", "zb-v", "dualpipev"};
constexpr std::array<std::string_view, 3> kCpImplNames{"ring", "ulysses", "hybrid"};
constexpr std::array<std::string_view, 2> kMoeRouterNames{"softmax", "sigmoid"};
constexpr std::array<std::string_view, 3> kMoeBalanceNames{"aux_loss", "bias", "none"};
constexpr std::array<std::string_view, 2> kAttentionNames{"mha", "mla"};
constexpr std::array<std::string_view, 4> kRopeTypeNames{"none", "linear", "llama3", "yarn"};

// ---- the key table ----

// One key of a section: how to read it from a TOML node into a Config and print it back.
struct Key {
  std::string_view name;
  bool text = false;  // string-valued: a --set value is used verbatim unless it is a TOML string
  std::function<Problem(const toml::node&, Config&)> read;
  std::function<std::string(const Config&)> write;
};

struct Section {
  std::string_view name;
  std::vector<Key> keys;
  const Key* find(std::string_view key) const {
    for (const Key& k : keys) {
      if (k.name == key) return &k;
    }
    return nullptr;
  }
};

// Builds the keys of a section of type S from pointers to its members. The section is a member of
// Config (`[train]`) or a member of one (`[model.moe]`: Config::model, then ModelConfig::moe).
template <typename S>
class SectionBuilder {
 public:
  SectionBuilder(std::string_view name, S Config::*section)
      : section_([section](Config& c) -> S& { return c.*section; }) {
    out_.name = name;
  }
  template <typename Outer>
  SectionBuilder(std::string_view name, Outer Config::*outer, S Outer::*section)
      : section_([outer, section](Config& c) -> S& { return c.*outer.*section; }) {
    out_.name = name;
  }

  template <typename T>
  SectionBuilder& add(std::string_view name, T S::*m) {
    auto sec = section_;
    out_.keys.push_back(
        Key{name, std::is_same_v<T, std::string>,
            [sec, m](const toml::node& n, Config& c) { return read_value(n, sec(c).*m); },
            [sec, m](const Config& c) { return toml_text(sec(mut(c)).*m); }});
    return *this;
  }

  // An enum, spelled as names[value].
  template <typename E, size_t N>
  SectionBuilder& add(std::string_view name, E S::*m,
                      const std::array<std::string_view, N>& names) {
    auto sec = section_;
    out_.keys.push_back(Key{name, true,
                            [sec, m, &names](const toml::node& n, Config& c) {
                              size_t i = 0;
                              Problem p = read_choice(n, names, i);
                              if (!p) sec(c).*m = static_cast<E>(i);
                              return p;
                            },
                            [sec, m, &names](const Config& c) {
                              return toml_string(names[static_cast<size_t>(sec(mut(c)).*m)]);
                            }});
    return *this;
  }

  // A string restricted to `names`.
  template <size_t N>
  SectionBuilder& add(std::string_view name, std::string S::*m,
                      const std::array<std::string_view, N>& names) {
    auto sec = section_;
    out_.keys.push_back(Key{name, true,
                            [sec, m, &names](const toml::node& n, Config& c) {
                              size_t i = 0;
                              Problem p = read_choice(n, names, i);
                              if (!p) sec(c).*m = std::string(names[i]);
                              return p;
                            },
                            [sec, m](const Config& c) { return toml_string(sec(mut(c)).*m); }});
    return *this;
  }

  // A set of names[i] (a member with a `bits` mask, bit i for names[i]), spelled as an array.
  template <typename Set, size_t N>
  SectionBuilder& add_set(std::string_view name, Set S::*m,
                          const std::array<std::string_view, N>& names) {
    auto sec = section_;
    out_.keys.push_back(Key{
        name, false,
        [sec, m, &names](const toml::node& n, Config& c) {
          uint32_t bits = 0;
          Problem p = read_choices(n, names, bits);
          if (!p) (sec(c).*m).bits = static_cast<decltype(Set::bits)>(bits);
          return p;
        },
        [sec, m, &names](const Config& c) { return choices_text(names, (sec(mut(c)).*m).bits); }});
    return *this;
  }

  Section build() { return std::move(out_); }

 private:
  // The writers only read: one accessor serves reading and writing.
  static Config& mut(const Config& c) { return const_cast<Config&>(c); }
  std::function<S&(Config&)> section_;
  Section out_;
};

// Every section and key, in the order to_toml prints them.
const std::vector<Section>& sections() {
  static const std::vector<Section> table = [] {
    using M = ModelConfig;
    using T = TrainConfig;
    using O = OptimizerConfig;
    using D = DataConfig;
    using L = LogConfig;
    using C = CheckpointConfig;
    using P = ParallelConfig;
    std::vector<Section> s;
    s.push_back(SectionBuilder<M>("model", &Config::model)
                    .add("arch", &M::arch, kArchNames)
                    .add("vocab_size", &M::vocab_size)
                    .add("n_layers", &M::n_layers)
                    .add("d_model", &M::d_model)
                    .add("n_heads", &M::n_heads)
                    .add("n_kv_heads", &M::n_kv_heads)
                    .add("d_ff", &M::d_ff)
                    .add("seq_len", &M::seq_len)
                    .add("norm", &M::norm, kNormNames)
                    .add("activation", &M::activation, kActivationNames)
                    .add("position", &M::position, kPositionNames)
                    .add("bias", &M::bias)
                    .add("tie_embeddings", &M::tie_embeddings)
                    .add("norm_eps", &M::norm_eps)
                    .add("rope_theta", &M::rope_theta)
                    .add("dropout", &M::dropout)
                    .add("init_std", &M::init_std)
                    .add("attention", &M::attention, kAttentionNames)
                    .add("mtp_depth", &M::mtp_depth)
                    .add("mtp_loss_weight", &M::mtp_loss_weight)
                    .build());
    s.push_back(
        SectionBuilder<RopeScaling>("model.rope_scaling", &Config::model, &M::rope_scaling)
            .add("rope_type", &RopeScaling::rope_type, kRopeTypeNames)
            .add("factor", &RopeScaling::factor)
            .add("original_max_position_embeddings", &RopeScaling::original_max_position_embeddings)
            .add("low_freq_factor", &RopeScaling::low_freq_factor)
            .add("high_freq_factor", &RopeScaling::high_freq_factor)
            .add("beta_fast", &RopeScaling::beta_fast)
            .add("beta_slow", &RopeScaling::beta_slow)
            .add("mscale", &RopeScaling::mscale)
            .add("mscale_all_dim", &RopeScaling::mscale_all_dim)
            .add("attention_factor", &RopeScaling::attention_factor)
            .build());
    s.push_back(SectionBuilder<MlaConfig>("model.mla", &Config::model, &M::mla)
                    .add("q_lora_rank", &MlaConfig::q_lora_rank)
                    .add("kv_lora_rank", &MlaConfig::kv_lora_rank)
                    .add("qk_nope_head_dim", &MlaConfig::qk_nope_head_dim)
                    .add("qk_rope_head_dim", &MlaConfig::qk_rope_head_dim)
                    .add("v_head_dim", &MlaConfig::v_head_dim)
                    .build());
    s.push_back(SectionBuilder<MoeConfig>("model.moe", &Config::model, &M::moe)
                    .add("num_experts", &MoeConfig::num_experts)
                    .add("top_k", &MoeConfig::top_k)
                    .add("d_ff_expert", &MoeConfig::d_ff_expert)
                    .add("router", &MoeConfig::router, kMoeRouterNames)
                    .add("normalize", &MoeConfig::normalize)
                    .add("n_group", &MoeConfig::n_group)
                    .add("topk_group", &MoeConfig::topk_group)
                    .add("routed_scaling_factor", &MoeConfig::routed_scaling_factor)
                    .add("balance", &MoeConfig::balance, kMoeBalanceNames)
                    .add("aux_loss_coef", &MoeConfig::aux_loss_coef)
                    .add("bias_update_rate", &MoeConfig::bias_update_rate)
                    .add("z_loss_coef", &MoeConfig::z_loss_coef)
                    .add("capacity_factor", &MoeConfig::capacity_factor)
                    .add("shared_experts", &MoeConfig::shared_experts)
                    .add("d_ff_shared", &MoeConfig::d_ff_shared)
                    .add("first_dense_layers", &MoeConfig::first_dense_layers)
                    .add("every", &MoeConfig::every)
                    .build());
    s.push_back(SectionBuilder<T>("train", &Config::train)
                    .add("steps", &T::steps)
                    .add("global_batch_size", &T::global_batch_size)
                    .add("micro_batch_size", &T::micro_batch_size)
                    .add("precision", &T::precision, kPrecisionNames)
                    .add("grad_dtype", &T::grad_dtype, kGradDTypeNames)
                    .add("seed", &T::seed)
                    .add("run_dir", &T::run_dir)
                    .add("device", &T::device, kDeviceNames)
                    .add("threads", &T::threads)
                    .add("eval_interval", &T::eval_interval)
                    .add("eval_iters", &T::eval_iters)
                    .add("recompute", &T::recompute, kRecomputeNames)
                    .add("recompute_layers", &T::recompute_layers)
                    .add_set("recompute_modules", &T::recompute_modules, kRecomputeModuleNames)
                    .add("distribute_saved_activations", &T::distribute_saved_activations)
                    .add("fp8", &T::fp8, kFp8Names)
                    .add("fp8_block", &T::fp8_block)
                    .add("on_nonfinite", &T::on_nonfinite, kOnNonfiniteNames)
                    .add("max_skipped_steps", &T::max_skipped_steps)
                    .add("time_limit", &T::time_limit)
                    .build());
    s.push_back(SectionBuilder<O>("optimizer", &Config::optimizer)
                    .add("type", &O::type, kOptimizerTypeNames)
                    .add("lr", &O::lr)
                    .add("min_lr", &O::min_lr)
                    .add("warmup_steps", &O::warmup_steps)
                    .add("decay", &O::decay, kDecayNames)
                    .add("decay_steps", &O::decay_steps)
                    .add("beta1", &O::beta1)
                    .add("beta2", &O::beta2)
                    .add("eps", &O::eps)
                    .add("weight_decay", &O::weight_decay)
                    .add("grad_clip", &O::grad_clip)
                    .add("initial_loss_scale", &O::initial_loss_scale)
                    .add("loss_scale_window", &O::loss_scale_window)
                    .build());
    s.push_back(SectionBuilder<MuonConfig>("optimizer.muon", &Config::optimizer, &O::muon)
                    .add("momentum", &MuonConfig::momentum)
                    .add("nesterov", &MuonConfig::nesterov)
                    .add("ns_steps", &MuonConfig::ns_steps)
                    .build());
    s.push_back(SectionBuilder<P>("parallel", &Config::parallel)
                    .add("tp", &P::tp)
                    .add("cp", &P::cp)
                    .add("cp_impl", &P::cp_impl, kCpImplNames)
                    .add("cp_ulysses", &P::cp_ulysses)
                    .add("cp_latent", &P::cp_latent)
                    .add("dp", &P::dp)
                    .add("ep", &P::ep)
                    .add("pp", &P::pp)
                    .add("pp_schedule", &P::pp_schedule, kScheduleNames)
                    .add("virtual_stages", &P::virtual_stages)
                    .add("pp_layers", &P::pp_layers)
                    .add("pp_max_deferred", &P::pp_max_deferred)
                    .add("zero_stage", &P::zero_stage)
                    .add("zero_shard_group", &P::zero_shard_group)
                    .add("zero_quantized_weights", &P::zero_quantized_weights)
                    .add("zero_quantized_gradients", &P::zero_quantized_gradients)
                    .add("zero_quantized_gradients_group", &P::zero_quantized_gradients_group)
                    .add("zero_quant_block", &P::zero_quant_block)
                    .add("zero_hierarchical_partition", &P::zero_hierarchical_partition)
                    .add("sequence_parallel", &P::sequence_parallel)
                    .add("bucket_mb", &P::bucket_mb)
                    .build());
    s.push_back(SectionBuilder<D>("data", &Config::data)
                    .add("source", &D::source, kSourceNames)
                    .add("seed", &D::seed)
                    .add("path", &D::path)
                    .add("sources", &D::sources)
                    .add("split", &D::split)
                    .add("tokenizer", &D::tokenizer)
                    .build());
    s.push_back(SectionBuilder<C>("checkpoint", &Config::checkpoint)
                    .add("dir", &C::dir)
                    .add("interval", &C::interval)
                    .add("keep_last", &C::keep_last)
                    .add("load", &C::load)
                    .add("init_from", &C::init_from)
                    .add("async", &C::async)
                    .build());
    s.push_back(SectionBuilder<CommConfig>("comm", &Config::comm)
                    .add("timeout_s", &CommConfig::timeout_s)
                    .build());
    s.push_back(SectionBuilder<OffloadConfig>("offload", &Config::offload)
                    .add("optimizer", &OffloadConfig::optimizer, kOffloadTargetNames)
                    .add("params", &OffloadConfig::params, kOffloadTargetNames)
                    .add("nvme_dir", &OffloadConfig::nvme_dir)
                    .add("buffer_mb", &OffloadConfig::buffer_mb)
                    .build());
    s.push_back(SectionBuilder<L>("log", &Config::log)
                    .add("interval", &L::interval)
                    .add("progress", &L::progress)
                    .add("metrics", &L::metrics)
                    .add("tensorboard", &L::tensorboard)
                    .add("peak_flops", &L::peak_flops)
                    .build());
    s.push_back(SectionBuilder<PlanConfig>("plan", &Config::plan)
                    .add("hardware", &PlanConfig::hardware)
                    .add("world", &PlanConfig::world)
                    .build());
    return s;
  }();
  return table;
}

const Section& find_section(std::string_view name) {
  for (const Section& s : sections())
    if (s.name == name) return s;
  LLMT_CHECK(false, "no config section ", name);
  return sections().front();
}

// The sections and keys, for the loader.
const Schema& schema() {
  static const Schema table = [] {
    Schema s;
    for (const Section& sec : sections()) {
      Schema::Section out{std::string(sec.name), {}};
      for (const Key& k : sec.keys) out.keys.push_back({std::string(k.name), k.text});
      s.sections.push_back(std::move(out));
    }
    return s;
  }();
  return table;
}

// ---- presets, derived defaults, rules ----

// Fills what the arch preset decides (unless given explicitly) and the 0 = "same as" defaults.
void resolve(Config& c, const std::set<std::string>& given) {
  // Each config its own run directory unless it names one: runs/<the config file's stem>.
  if (!given.count("train.run_dir") && !fs::path(c.source_path).stem().empty())
    c.train.run_dir = (fs::path("runs") / fs::path(c.source_path).stem()).string();
  ModelConfig& m = c.model;
  const ModelConfig preset = model_preset(m.arch);
  if (!given.count("model.norm")) m.norm = preset.norm;
  if (!given.count("model.activation")) m.activation = preset.activation;
  if (!given.count("model.position")) m.position = preset.position;
  if (!given.count("model.bias")) m.bias = preset.bias;
  if (!given.count("model.tie_embeddings")) m.tie_embeddings = preset.tie_embeddings;
  if (m.d_ff == 0 && m.d_model >= 1) m.d_ff = preset_d_ff(m.arch, m.d_model);
  if (m.n_kv_heads == 0) m.n_kv_heads = m.n_heads;
  if (m.moe.d_ff_expert == 0) m.moe.d_ff_expert = m.d_ff;
  if (m.moe.d_ff_shared == 0) m.moe.d_ff_shared = m.moe.d_ff_expert;
  if (c.train.micro_batch_size == 0) c.train.micro_batch_size = c.train.global_batch_size;
  if (c.optimizer.decay_steps == 0) c.optimizer.decay_steps = c.train.steps;
  if (c.data.seed == 0) c.data.seed = c.train.seed;
}

void check_rules(const Config& c, const Config& raw, Rules& r) {
  const ModelConfig& m = c.model;
  check_model_config(m, raw.model, r);
  const TrainConfig& t = c.train;
  r.at_least<int64_t>("train.steps", t.steps, 1);
  r.at_least<int64_t>("train.global_batch_size", t.global_batch_size, 1);
  if (raw.train.micro_batch_size != 0) {
    r.at_least<int64_t>("train.micro_batch_size", t.micro_batch_size, 1,
                        ", or 0 for train.global_batch_size");
  }
  if (t.global_batch_size >= 1 && t.micro_batch_size >= 1) {
    r.require(t.global_batch_size % t.micro_batch_size == 0,
              {"train.global_batch_size", "train.micro_batch_size"},
              concat("train.global_batch_size=", t.global_batch_size,
                     " is not divisible by train.micro_batch_size=", t.micro_batch_size,
                     ": a step is a whole number of micro-batches"));
  }
  if (t.steps >= 1 && t.global_batch_size >= 1 && m.seq_len >= 1) {
    // Sample indices and token offsets are 64-bit: the run's last token must have one.
    const long double tokens = static_cast<long double>(t.steps) *
                               static_cast<long double>(t.global_batch_size) *
                               static_cast<long double>(m.seq_len + 1);
    r.require(tokens <= static_cast<long double>(INT64_MAX),
              {"train.steps", "train.global_batch_size", "model.seq_len"},
              concat("train.steps=", t.steps, " x train.global_batch_size=", t.global_batch_size,
                     " x (model.seq_len + 1)=", m.seq_len + 1, " = ", static_cast<double>(tokens),
                     " token positions: more than the 9.2e18 a run can address (64-bit sample "
                     "and token offsets); no dataset can be read that far"));
  }
  r.require(!t.run_dir.empty(), {"train.run_dir"}, "train.run_dir must not be empty");
  r.at_least<int64_t>("train.threads", t.threads, 0);
  r.at_least<int64_t>("train.recompute_layers", t.recompute_layers, 0, ", or 0 for every layer");
  if (m.n_layers >= 1) {
    r.require(t.recompute_layers <= m.n_layers, {"train.recompute_layers", "model.n_layers"},
              concat("train.recompute_layers=", t.recompute_layers,
                     " exceeds model.n_layers=", m.n_layers, "; use 0 to recompute every layer"));
  }
  if (t.recompute_layers > 0) {
    r.require(t.recompute != Recompute::none, {"train.recompute_layers", "train.recompute"},
              concat("train.recompute_layers=", t.recompute_layers,
                     " chooses layers to recompute, but train.recompute=\"none\"; set "
                     "train.recompute to \"selective\" or \"full\", or recompute_layers to 0"));
  }

  if (t.recompute == Recompute::selective) {
    r.require(t.recompute_modules.bits != 0, {"train.recompute_modules", "train.recompute"},
              "train.recompute_modules is empty, so train.recompute=\"selective\" would "
              "recompute nothing: list some of \"core_attn\", \"layernorm\", \"act\", "
              "\"moe_act\", \"mla_up_proj\", or set train.recompute=\"none\"");
    // "act" reruns the dense MLPs' and the shared experts' activation, not the routed experts'.
    if (t.recompute_modules.act())
      r.require(m.has_unrouted_mlp(), {"train.recompute_modules", "model.moe.num_experts"},
                "train.recompute_modules lists \"act\", which reruns the activation of the dense "
                "MLPs and the shared experts, but every MLP of this model is a mixture of routed "
                "experts without shared experts: remove \"act\" (\"moe_act\" reruns the routed "
                "experts')");
    // "moe_act" reruns the routed experts'.
    if (t.recompute_modules.moe_act())
      r.require(m.moe.num_experts > 0, {"train.recompute_modules", "model.moe.num_experts"},
                "train.recompute_modules lists \"moe_act\", which reruns the routed experts' "
                "activation, but this model has no mixture-of-experts layer "
                "(model.moe.num_experts=0): remove \"moe_act\", or list \"act\" for the dense "
                "MLPs'");
    // "mla_up_proj" reruns latent attention's up projections from the saved query latent.
    if (t.recompute_modules.mla_up_proj()) {
      r.require(m.mla_attention(), {"train.recompute_modules", "model.attention"},
                "train.recompute_modules lists \"mla_up_proj\", which reruns latent attention's "
                "up projections, but model.attention=\"mha\": remove \"mla_up_proj\"");
      if (m.mla_attention())
        r.require(m.mla.q_lora_rank > 0, {"train.recompute_modules", "model.mla.q_lora_rank"},
                  "train.recompute_modules lists \"mla_up_proj\", which reruns the queries' up "
                  "projection from the saved query latent, but model.mla.q_lora_rank=0 projects "
                  "the queries from the layer's input: remove \"mla_up_proj\"");
    }
  } else {
    r.require(t.recompute_modules == RecomputeModules{},
              {"train.recompute_modules", "train.recompute"},
              concat("train.recompute_modules chooses what selective recompute reruns, but "
                     "train.recompute=",
                     toml_string(kRecomputeNames[static_cast<size_t>(t.recompute)]),
                     "; set train.recompute=\"selective\", or remove recompute_modules"));
  }

  if (t.distribute_saved_activations) {
    const ParallelConfig& p = c.parallel;
    r.require(t.recompute == Recompute::full,
              {"train.distribute_saved_activations", "train.recompute"},
              "train.distribute_saved_activations splits the input a fully recomputed layer "
              "saves over tp, but train.recompute is not \"full\": set it to \"full\", or "
              "distribute_saved_activations to false");
    r.require(p.tp > 1 && !p.sequence_parallel,
              {"train.distribute_saved_activations", "parallel.tp", "parallel.sequence_parallel"},
              concat("train.distribute_saved_activations splits what every tp rank saves alike, "
                     "which needs parallel.tp > 1 without sequence parallelism (tp=",
                     p.tp, ", sequence_parallel=", p.sequence_parallel ? "true" : "false",
                     "; under sequence parallelism each rank already saves 1/tp of the rows)"));
    r.require(std::find(p.pp_layers.begin(), p.pp_layers.end(), int64_t{0}) == p.pp_layers.end(),
              {"train.distribute_saved_activations", "parallel.pp_layers"},
              "train.distribute_saved_activations needs a layer on every pipeline stage "
              "(parallel.pp_layers has a 0): a stage's first layer saves the part it receives");
  }

  if (t.fp8 != Fp8Scaling::none) {
    r.require(t.precision != Precision::fp32, {"train.fp8", "train.precision"},
              concat("train.fp8=\"", kFp8Names[static_cast<size_t>(t.fp8)],
                     "\" quantises the GEMM inputs of a 16-bit run (bf16, as DeepSeek-V3, or "
                     "fp16), but train.precision=\"fp32\": set train.precision to \"bf16\", "
                     "or train.fp8 to \"none\""));
  }
  r.at_least<int64_t>("train.fp8_block", t.fp8_block, 1, " (the tile side, 128 in DeepSeek-V3)");
  r.require(t.fp8 == Fp8Scaling::blockwise || t.fp8_block == 128, {"train.fp8_block", "train.fp8"},
            concat("train.fp8_block=", t.fp8_block,
                   " sets the tiles of train.fp8=\"blockwise\", "
                   "but train.fp8=\"",
                   kFp8Names[static_cast<size_t>(t.fp8)],
                   "\": set train.fp8 to \"blockwise\", or leave fp8_block at 128"));
  r.at_least<int64_t>("train.max_skipped_steps", t.max_skipped_steps, 0, " (0 = never stop)");
  r.at_least("train.time_limit", t.time_limit, 0.0, " (seconds; 0 = no limit)");

  r.require(t.grad_dtype != GradDType::compute || t.precision != Precision::fp32,
            {"train.grad_dtype", "train.precision"},
            "train.grad_dtype=\"compute\" stores gradients in the compute type, which "
            "train.precision=\"fp32\" does not have: set train.precision to \"bf16\" or "
            "\"fp16\", or train.grad_dtype to \"fp32\"");
  check_optimizer_config(c.optimizer, raw.optimizer, t.precision == Precision::fp16, r);
  check_parallel_config(c.parallel, m.n_layers, r);
  check_model_layout(m, c.parallel, r);

  r.at_least<int64_t>("train.eval_interval", t.eval_interval, 0, " (0 = no validation)");
  if (t.eval_interval > 0) r.at_least<int64_t>("train.eval_iters", t.eval_iters, 1);
  check_data_config(c.data, t.eval_interval, r);

  check_checkpoint_config(c.checkpoint, r);
  check_comm_config(c.comm, r);
  check_offload_config(c.offload, r);
  r.require(c.offload.params != OffloadTarget::nvme || c.parallel.zero_stage == 3,
            {"offload.params", "parallel.zero_stage"},
            concat("offload.params=\"nvme\" keeps ZeRO-3's parameter shards in files, but "
                   "parallel.zero_stage=",
                   c.parallel.zero_stage, "; set zero_stage to 3 (at any dp, 1 included)"));
  r.at_least<int64_t>("log.interval", c.log.interval, 1);
  r.at_least("log.peak_flops", c.log.peak_flops, 0.0);
  r.at_least<int64_t>("plan.world", c.plan.world, 0, " (0 = the layout's own)");
}

// Data paths written in a config file are relative to that file's folder, as includes are;
// --set ones (no line number) to the current directory.
void resolve_data_paths(Config& c, const std::vector<Setting>& settings) {
  for (const Setting& s : settings) {
    if (s.section != "data" || s.at.line == 0) continue;
    const fs::path dir = fs::path(s.at.file).parent_path();
    auto resolve = [&](std::string& path) {
      if (!path.empty() && fs::path(path).is_relative())
        path = (dir / path).lexically_normal().string();
    };
    if (s.key == "path") resolve(c.data.path);
    if (s.key == "tokenizer") resolve(c.data.tokenizer);
    if (s.key == "sources")
      for (DataSourceConfig& e : c.data.sources) resolve(e.path);
  }
}

Config build(Loader& loader, const std::vector<std::string>& overrides, const std::string& source) {
  for (const std::string& o : overrides) loader.add_override(o);
  Config c;
  c.source_path = source;
  std::vector<std::string> errors = std::move(loader.errors);
  std::set<std::string> given;
  for (const Setting& s : loader.settings) {
    given.insert(s.dotted());
    const Key* key = find_section(s.section).find(s.key);
    if (Problem p = key->read(*s.node, c))
      errors.push_back(concat(s.dotted(), " at ", s.at.str(), ": ", *p));
  }
  if (!errors.empty()) throw ConfigError(join_lines(errors));
  resolve_data_paths(c, loader.settings);

  const Config raw = c;
  resolve(c, given);
  Rules rules(loader.origins());
  check_rules(c, raw, rules);
  if (!rules.errors.empty()) throw ConfigError(join_lines(rules.errors));
  return c;
}

}  // namespace

Config parse_config(const std::string& path, const std::vector<std::string>& overrides) {
  Loader loader(schema());
  loader.load_file(path, "config file");
  return build(loader, overrides, path);
}

Config parse_config_string(const std::string& text, const std::string& name,
                           const std::vector<std::string>& overrides) {
  Loader loader(schema());
  loader.load_text(text, name);
  return build(loader, overrides, name);
}

std::string to_toml(const Config& c) {
  std::string out =
      "# llmtrain config, fully resolved: every key, presets and defaults filled in.\n";
  if (!c.source_path.empty()) out += concat("# source: ", toml_string(c.source_path), "\n");
  for (const Section& s : sections()) {
    out += concat("\n[", s.name, "]\n");
    for (const Key& k : s.keys) out += concat(k.name, " = ", k.write(c), "\n");
  }
  return out;
}

std::vector<std::string> config_keys() {
  std::vector<std::string> out;
  for (const Section& s : sections())
    for (const Key& k : s.keys) out.push_back(concat(s.name, ".", k.name));
  return out;
}

MeshShape mesh_shape(const ParallelConfig& p, int world) {
  MeshShape s;
  const int64_t rest = p.tp * p.cp * p.pp;
  const int64_t dp = p.dp == -1 ? (rest > 0 && world % rest == 0 ? world / rest : 0) : p.dp;
  s.degree = {static_cast<int>(p.tp), static_cast<int>(p.cp), static_cast<int>(dp),
              static_cast<int>(p.pp)};
  return s;
}

std::string recompute_modules_text(RecomputeModules m) {
  return choices_text(kRecomputeModuleNames, m.bits);
}

const std::vector<std::string>& ddp_overrides() {
  static const std::vector<std::string> sets{"parallel.zero_stage=0",
                                             "parallel.zero_shard_group=0",
                                             "parallel.zero_quantized_weights=false",
                                             "parallel.zero_quantized_gradients=false",
                                             "parallel.zero_quantized_gradients_group=0",
                                             "parallel.zero_quant_block=256",
                                             "parallel.zero_hierarchical_partition=0",
                                             "offload.params=\"none\""};
  return sets;
}

const std::vector<std::string>& no_pipeline_overrides() {
  static const std::vector<std::string> sets{"parallel.pp=1", "parallel.pp_schedule=\"1f1b\"",
                                             "parallel.virtual_stages=1", "parallel.pp_layers=[]",
                                             "parallel.pp_max_deferred=-1"};
  return sets;
}

const std::vector<std::string>& no_offload_overrides() {
  static const std::vector<std::string> sets{"offload.optimizer=\"none\"",
                                             "offload.params=\"none\"", "offload.nvme_dir=\"\"",
                                             "offload.buffer_mb=64"};
  return sets;
}

int64_t layout_min_ranks(const ParallelConfig& p) {
  return p.tp * p.cp * p.pp * std::max<int64_t>(p.dp, 1);
}

void validate_layout(const Config& c, int world) {
  const ParallelConfig& p = c.parallel;
  std::vector<std::string> errors;
  const int64_t rest = p.tp * p.cp * p.pp;
  if (p.dp == -1 && world % rest != 0) {
    errors.push_back(concat("parallel.dp=-1: world size ", world, " is not divisible by tp(", p.tp,
                            ")*cp(", p.cp, ")*pp(", p.pp, ")=", rest));
  } else {
    const MeshShape s = mesh_shape(p, world);
    if (s.world() != world)
      errors.push_back(concat("tp(", p.tp, ")*cp(", p.cp, ")*dp(", s.size(Axis::dp), ")*pp(", p.pp,
                              ")=", s.world(), " != world size ", world,
                              ": set [parallel] degrees whose product is the number of ranks, or "
                              "dp = -1"));
    const int64_t dp = s.size(Axis::dp);
    if (p.ep > 1 && dp >= 1 && (dp * p.cp) % p.ep != 0)
      errors.push_back(concat("parallel.ep=", p.ep, " does not divide dp(", dp, ")",
                              p.cp > 1 ? concat("*cp(", p.cp, ")") : std::string(),
                              ": each group of ep consecutive ranks of the dp",
                              p.cp > 1 ? " x cp" : "", " group shares out the experts"));
    // Groups of n consecutive dp ranks (x cp), set by `key`: n divides dp, and under ep each
    // group holds every expert (its ep groups lie inside it).
    auto dp_groups = [&](const char* key, int64_t n, const std::string& what,
                         const std::string& experts) {
      if (n <= 0 || dp < 1) return;
      if (dp % n != 0)
        errors.push_back(concat("parallel.", key, "=", n, " does not divide dp(", dp, "): ", what));
      else if (p.ep > 1 && (n * p.cp) % p.ep != 0)
        errors.push_back(concat("parallel.ep=", p.ep, " does not divide parallel.", key, "(", n,
                                ")", p.cp > 1 ? concat("*cp(", p.cp, ")") : std::string(), ": ",
                                experts));
    };
    dp_groups("zero_shard_group", p.zero_shard_group,
              "ZeRO shards within groups of that many consecutive dp ranks and replicates across "
              "dp/zero_shard_group of them",
              "each shard group must hold every expert, so its ep groups must lie inside it");
    dp_groups("zero_hierarchical_partition", p.zero_hierarchical_partition,
              "the secondary copy is sharded within groups of that many consecutive dp ranks",
              "each secondary group must hold every expert");
    dp_groups("zero_quantized_gradients_group", p.zero_quantized_gradients_group,
              "qgZ's first hop runs within groups of that many consecutive dp ranks",
              "each first-hop group must hold every expert");
    const int64_t gbs = c.train.global_batch_size, mbs = c.train.micro_batch_size;
    if (dp >= 1 && gbs % (dp * mbs) != 0)
      errors.push_back(concat("train.global_batch_size=", gbs, " is not divisible by dp(", dp,
                              ")*train.micro_batch_size(", mbs, ")=", dp * mbs,
                              ": each dp rank runs a whole number of micro-batches"));
    else if (dp >= 1 && p.pp > 1 && p.pp_schedule == PipeSchedule::interleaved &&
             (gbs / (dp * mbs)) % p.pp != 0)
      errors.push_back(concat("parallel.pp_schedule=\"interleaved\" needs the micro-batches per ",
                              "step, train.global_batch_size(", gbs, ")/(dp(", dp,
                              ")*train.micro_batch_size(", mbs, "))=", gbs / (dp * mbs),
                              ", to be divisible by parallel.pp=", p.pp));
    else if (dp >= 1 && p.pp > 1 && p.pp_schedule == PipeSchedule::dualpipe_v &&
             gbs / (dp * mbs) < 2 * p.pp - 1)
      errors.push_back(
          concat("parallel.pp_schedule=\"dualpipev\" needs at least 2*pp-1=", 2 * p.pp - 1,
                 " micro-batches per step, train.global_batch_size(", gbs, ")/(dp(", dp,
                 ")*train.micro_batch_size(", mbs, "))=", gbs / (dp * mbs),
                 ": raise the batch, lower the micro-batch size, or use \"zb-v\""));
  }
  if (!errors.empty()) throw ConfigError(join_lines(errors));
}

std::string rank_map(const MeshShape& shape) {
  std::string out = "# rank   tp cp dp pp\n";
  for (int r = 0; r < shape.world(); ++r) {
    const auto c = shape.coords(r);
    char line[64];
    std::snprintf(line, sizeof line, "%6d  %3d %2d %2d %2d\n", r, c[0], c[1], c[2], c[3]);
    out += line;
  }
  return out;
}

int64_t grad_accum_steps(const Config& c) {
  const int64_t micro =
      c.train.micro_batch_size > 0 ? c.train.micro_batch_size : c.train.global_batch_size;
  return c.train.global_batch_size / micro;
}

std::string_view precision_name(Precision p) {
  return kPrecisionNames[static_cast<size_t>(p)];
}

}  // namespace llmt

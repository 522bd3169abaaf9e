// llmtrain generate: text from a checkpoint, one token at a time through a KV cache, on one rank
// or over tp ranks (mpirun -np N: each rank holds 1/N of the heads, the FFN and the vocabulary).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "app/commands.h"
#include "checkpoints/checkpoint.h"
#include "checkpoints/store.h"
#include "core/check.h"
#include "data/tokenizer.h"
#include "engine/comm/communicator.h"
#include "engine/model/parallelize.h"
#include "engine/model/transformer.h"
#include "engine/optim/sharded_optimizer.h"
#include "train/config.h"
#include "train/trainer.h"

namespace llmt::app {

namespace {

// The model's weights as the training state a checkpoint loads (the master weights only).
class Weights final : public TrainingState {
 public:
  explicit Weights(Transformer& model) : model_(model) {}
  std::vector<std::string> state_names() const override { return {kMasterState}; }
  std::vector<StateTensor> state_tensors() override {
    std::vector<StateTensor> out;
    for (size_t i = 0; i < model_.params().size(); ++i)
      out.push_back({kMasterState, i, model_.params()[i], 0});
    return out;
  }
  void after_load() override { model_.sync_compute_weights(); }

 private:
  Transformer& model_;
};

struct Sampling {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: every token
  double top_p = 1.0;
};

// The next token from logits (V): the argmax at temperature 0 (the lowest id of a tie), else a
// draw from softmax(logits / temperature) restricted to the top_k most likely tokens and then to
// the smallest set of them whose probability reaches top_p.
int32_t sample(const std::vector<float>& logits, const Sampling& s, std::mt19937_64& rng) {
  const auto V = static_cast<int64_t>(logits.size());
  if (s.temperature <= 0)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  const int64_t k = s.top_k > 0 ? std::min(s.top_k, V) : V;
  std::vector<double> p(static_cast<size_t>(k));
  const double top = logits[static_cast<size_t>(ids[0])];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i)
    sum += p[static_cast<size_t>(i)] =
        std::exp((logits[static_cast<size_t>(ids[static_cast<size_t>(i)])] - top) / s.temperature);
  int64_t keep = k;
  if (s.top_p < 1.0) {
    double cum = 0;
    for (keep = 0; keep < k;) {
      cum += p[static_cast<size_t>(keep++)] / sum;
      if (cum >= s.top_p) break;
    }
  }
  std::discrete_distribution<int64_t> pick(p.begin(), p.begin() + keep);
  return ids[static_cast<size_t>(pick(rng))];
}

}  // namespace

Run add_generate_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, prompt, tokenizer;
    int64_t max_new_tokens = 64;
    Sampling sampling;
    uint64_t seed = 0;
    bool ignore_eos = false;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Continue a prompt with a checkpoint's model (KV cache; under mpirun -np N over N tp ranks)");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "A checkpoint, or a checkpoint.dir holding a `latest` file")
      ->required();
  cmd->add_option("--prompt", args->prompt, "The text to continue (empty: from a document start)");
  cmd->add_option("--max-new-tokens", args->max_new_tokens,
                  "Tokens to generate at most (the prompt and these fit model.seq_len)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", args->sampling.temperature,
                  "Softmax temperature; 0 = greedy (always the most likely token)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-k", args->sampling.top_k, "Sample among the k most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", args->sampling.top_p,
                  "Sample among the most likely tokens whose probability reaches p (nucleus)")
      ->check(CLI::Range(0.0, 1.0, "(0, 1]"));
  cmd->add_option("--seed", args->seed, "Seed of the sampling (the same seed, the same text)");
  cmd->add_flag("--ignore-eos", args->ignore_eos,
                "Go on past the end-of-document token instead of stopping there");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "A SentencePiece model (default: the run's data.tokenizer)");
  cmd->add_option("--set", args->overrides,
                  "Override a key of the run's config (e.g. train.device=cuda, train.precision)");
  return [args]() {
    if (args->sampling.top_p <= 0) throw ConfigError("--top-p must be in (0, 1]");
    const std::string dir = ckpt::resolve_checkpoint_dir(args->checkpoint);
    const ckpt::Checkpoint ck(dir);
    CommRuntime runtime;
    std::unique_ptr<Communicator> world = make_world_communicator();
    const int world_size = world->size();
    // Latent attention under tp projects each rank's rows of the sequence down (sequence
    // parallelism), and a decoding step has one token: it decodes on one rank.
    if (world_size > 1 && parse_config_string(ck.state().config,
                                              std::string(ckpt::kIndexFile) + " (attribute config)")
                              .model.mla_attention())
      throw ConfigError(detail::concat(
          "the model of ", dir,
          " has latent attention (model.attention=\"mla\"), which decodes on one rank: its tp "
          "ranks each project their own rows of the sequence, and a decoding step has one token; "
          "run generate without mpirun (",
          world_size, " ranks here)"));
    // The run's config at tp = the world (decoding one token: no sequence parallelism).
    std::vector<std::string> sets = {
        "parallel.tp=" + std::to_string(world_size), "parallel.cp=1", "parallel.cp_impl=ring",
        "parallel.dp=1", "parallel.ep=1", "parallel.sequence_parallel=false",
        "train.micro_batch_size=1", "train.global_batch_size=1", "train.recompute=\"none\"",
        "train.recompute_layers=0", "train.recompute_modules=[\"core_attn\"]",
        "train.distribute_saved_activations=false",
        // one token at a time: no expert capacity drops it
        "model.moe.capacity_factor=0"};
    sets.insert(sets.end(), no_pipeline_overrides().begin(), no_pipeline_overrides().end());
    sets.insert(sets.end(), ddp_overrides().begin(), ddp_overrides().end());
    // No update: the stored run's offload folder is not needed.
    sets.insert(sets.end(), no_offload_overrides().begin(), no_offload_overrides().end());
    sets.insert(sets.end(), args->overrides.begin(), args->overrides.end());
    Config cfg;
    try {
      cfg = parse_config_string(ck.state().config,
                                std::string(ckpt::kIndexFile) + " (attribute config)", sets);
      validate_layout(cfg, world_size);
    } catch (const ConfigError& e) {
      throw ConfigError("the config stored in " + dir + " at tp " + std::to_string(world_size) +
                        ": " + e.what());
    }
    const std::string tok_path = args->tokenizer.empty() ? cfg.data.tokenizer : args->tokenizer;
    if (tok_path.empty())
      throw ConfigError("the run of " + dir +
                        " has no data.tokenizer (synthetic data?): give --tokenizer MODEL");
    const Tokenizer tok(tok_path);
    if (tok.vocab_size() > cfg.model.vocab_size)
      throw ConfigError(detail::concat("the tokenizer ", tok_path, " has ", tok.vocab_size(),
                                       " pieces, the model's vocabulary ", cfg.model.vocab_size));
    // The prompt follows an end-of-document token, as a document does in the training stream
    // (data prepare ends each with it).
    std::vector<int32_t> ids;
    if (tok.eos_id() >= 0) ids.push_back(tok.eos_id());
    for (int32_t id : tok.encode(args->prompt)) ids.push_back(id);
    if (ids.empty())
      throw ConfigError("an empty prompt and a tokenizer without eos: give --prompt");
    const int64_t seq_len = cfg.model.seq_len, n_prompt = static_cast<int64_t>(ids.size());
    if (n_prompt >= seq_len)
      throw ConfigError(detail::concat("the prompt is ", n_prompt, " tokens; model.seq_len = ",
                                       seq_len, " leaves no room to generate"));
    const int64_t max_new = std::min(args->max_new_tokens, seq_len - n_prompt);

    Mesh mesh = Mesh::create(mesh_shape(cfg.parallel, world_size), std::move(world));
    const bool rank0 = mesh.rank() == 0;
    const std::unique_ptr<DeviceBackend> backend =
        make_device_backend(select_device(cfg.train.device, local_rank_from_env()));
    Allocator alloc(*backend);
    const ModelSpec global = ModelSpec::from_config(cfg.model);
    ckpt::check_model(ck, global, ck.states());
    const ModelSpec spec =
        parallelize(global, model_layout(cfg.parallel, mesh.shape()), mesh.rank());
    Communicator& tp = mesh.comm(Axis::tp);
    const DType compute = compute_dtype(cfg.train.precision);
    Transformer model(spec, alloc, 1, compute, ModelStorage{true, false, true},
                      TensorParallel{world_size > 1 ? &tp : nullptr, false}, {}, {}, nullptr,
                      n_prompt + max_new);
    Weights weights(model);
    ckpt::load(ck, spec, weights, *backend, /*weights_only=*/true);

    const int64_t V = cfg.model.vocab_size, Vl = V / world_size;
    Buffer token_buf = alloc.allocate(4, MemCategory::other);
    Buffer gathered = alloc.allocate(static_cast<size_t>(V) * 4, MemCategory::other);
    Tensor token = token_buf.tensor({1, 1}, DType::i32);
    std::vector<float> logits;
    std::mt19937_64 rng(args->seed);
    std::vector<int32_t> out_ids;
    // What is printed: the prompt as the tokenizer decodes it, then what each new token adds to
    // the decoded whole (decoding the continuation alone would drop its leading space).
    const size_t first = tok.eos_id() >= 0 ? 1 : 0;  // the prompt's first token in ids
    std::string printed = tok.decode(std::span<const int32_t>(ids).subspan(first));
    if (rank0) {
      std::fputs(printed.c_str(), stdout);
      std::fflush(stdout);
    }
    const auto t0 = std::chrono::steady_clock::now();
    bool eos = false;
    int64_t steps = 0;
    for (int64_t pos = 0; pos + 1 < n_prompt + max_new && !eos; ++pos) {
      backend->copy_from_host(token.data, &ids[static_cast<size_t>(pos)], 4);
      Tensor local = model.decode(token, pos);  // (1, V/tp)
      ++steps;
      if (pos + 1 < n_prompt) continue;  // the prompt: only filling the cache
      Tensor all = gathered.tensor({V}, DType::f32);
      if (world_size > 1)
        tp.all_gather(all, local.view({Vl})).wait();
      else
        all = local.view({V});
      logits.resize(static_cast<size_t>(V));
      backend->copy_to_host(logits.data(), all.data, static_cast<size_t>(V) * 4);
      // A vocabulary padded past the tokenizer's pieces (e.g. 50304 for 50257): those ids decode
      // to nothing, so they are never drawn.
      logits.resize(static_cast<size_t>(tok.vocab_size()));
      int32_t next = sample(logits, args->sampling, rng);
      if (world_size > 1)  // every rank continues with rank 0's draw
        mesh.world().broadcast(Tensor(&next, {1}, DType::i32), 0).wait();
      eos = next == tok.eos_id() && !args->ignore_eos;
      if (eos) break;
      ids.push_back(next);
      out_ids.push_back(next);
      if (rank0) {
        const std::string text = tok.decode(std::span<const int32_t>(ids).subspan(first));
        if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
          std::fputs(text.c_str() + printed.size(), stdout);
          std::fflush(stdout);
          printed = text;
        }
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank0) {
      std::printf("\n");
      std::fflush(stdout);
      std::fprintf(stderr,
                   "generate: %s, %zu tokens (%s) after a %lld-token prompt, %.3g s, %.4g "
                   "positions/s, tp %d\n",
                   dir.c_str(), out_ids.size(), eos ? "stopped at end of document" : "max",
                   static_cast<long long>(n_prompt), s, static_cast<double>(steps) / s, world_size);
      std::fprintf(stderr, "token ids:");
      for (int32_t id : out_ids) std::fprintf(stderr, " %d", id);
      std::fprintf(stderr, "\n");
    }
    return 0;
  };
}

}  // namespace llmt::app

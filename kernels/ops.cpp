// The op dispatcher: checks every argument's device, dtype and shape (messages name the op and
// the tensors), then calls the raw-pointer kernel of the tensors' device. Row-wise ops accept any
// leading dims, (N,C) or (B,T,C) alike. CUDA tensors go to kernels/cuda in builds with
// LLMTRAIN_CUDA; other builds refuse them with a message that says so.
#include "kernels/ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_ops.h"

#ifdef LLMTRAIN_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
// The kernel `fn` of the op's device: cpu:: and cuda:: declare the same signatures.
#define LLMT_KERNEL(op, fn) (op).kernel((op).cuda() ? ::llmt::cuda::fn : ::llmt::cpu::fn)
#else
#define LLMT_KERNEL(op, fn) (op).kernel(::llmt::cpu::fn)
#endif

namespace llmt::ops {
namespace {

// Given, or an empty tensor (which may have no memory, e.g. a rank's empty shard).
bool present(const Tensor& t) {
  return t.defined() || (t.ndim() > 0 && t.numel() == 0);
}

// The op calls under way on this thread, each holding scratch slots [first, first + count).
thread_local int scratch_slots_in_use = 0;
// The live Recording's tally on this thread (null: ops run their kernels).
thread_local OpTally* recording_tally = nullptr;

bool is_16bit(DType t) {
  return t == DType::bf16 || t == DType::f16;
}

// Checks `cond` for op `op`, formatting the message (which may describe tensors) only when it
// fails: the checks run on every call, also where no kernel runs (ops::Recording).
#define LLMT_OP_REQUIRE(op, cond, ...)                                 \
  do {                                                                 \
    if (!(cond)) [[unlikely]]                                          \
      (op).fail(__FILE__, __LINE__, #cond __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)

// A kernel to call, or (skip: under a Recording) a stand-in that runs nothing.
template <typename R, typename... A>
struct Kernel {
  R (*fn)(A...);
  bool skip;
  R operator()(A... a) const {
    if (skip) return R();
    return fn(a...);
  }
};

// The checks of one op call; constructing it checks that every given tensor is on one device
// (mixed_devices: any devices, for copies) and that this build has kernels for it.
//
// 16-bit storage. The kernels compute in fp32 on fp32 arrays; an argument taken with in(),
// out() or inout() may also be a bf16 or f16 tensor. It is then widened into backend scratch
// before the kernel (in, inout: exact) and, when the kernel writes it (out, inout), narrowed
// back when the Op ends, rounding to nearest even: an op that writes a 16-bit tensor rounds its
// result once, as `op; round_to(result)` did on fp32 storage. Arguments that are the same memory
// share one copy (an output that may alias an input); 16-bit arguments must not overlap
// otherwise. Arguments taken with f32() stay fp32 in every precision: statistics (mean, rstd,
// lse), router math, master weights and optimizer states.
class Op {
 public:
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;
  ~Op() {
    try {
      for (const Widened& w : widened_)
        if (w.written) LLMT_KERNEL(*this, convert)(w.data, w.dtype, w.scratch, DType::f32, w.numel);
    } catch (const std::exception&) {
      // A failing conversion (a CUDA error) resurfaces at the device's next call.
    }
    scratch_slots_in_use -= static_cast<int>(widened_.size());
    if (tally_) {
      const std::string_view n(name_);
      const bool matmul = n.starts_with("linear_") || n.starts_with("grouped_linear_") ||
                          n == "attention_forward" || n == "attention_backward" ||
                          n == "attention_block_forward" || n == "attention_block_backward";
      if (matmul) {
        tally_->matmul_bytes += moved_;
      } else if (n == "round_to") {
        tally_->rounding_bytes += moved_;
      } else {
        tally_->other_bytes += moved_;
        tally_->bytes[name_] += moved_;
      }
      ++tally_->ops;
    }
  }

  Op(const char* name, std::initializer_list<Tensor> tensors, bool mixed_devices = false)
      : Op(name, std::span<const Tensor>(tensors.begin(), tensors.size()), mixed_devices) {}
  Op(const char* name, std::span<const Tensor> tensors, bool mixed_devices = false)
      : name_(name), tally_(recording_tally) {
    bool first = true;
    for (const Tensor& t : tensors) {
      if (!t.defined()) continue;
      if (t.device.kind == DeviceKind::cuda) cuda_ = true;
      LLMT_CHECK(mixed_devices || first || t.device == device_, "op ", name_,
                 ": tensors on different devices (", describe(t), " is on ",
                 device_name(t.device.kind), ":", t.device.index, ", another on ",
                 device_name(device_.kind), ":", device_.index, ")");
      if (first) device_ = t.device;
      first = false;
    }
#ifndef LLMTRAIN_HAVE_CUDA
    if (cuda_)
      throw Error(detail::concat("op ", name_,
                                 ": a CUDA tensor, but this build has no CUDA kernels "
                                 "(LLMTRAIN_CUDA=OFF)"));
#endif
  }
  // True if any given tensor is on a GPU.
  bool cuda() const {
    return cuda_;
  }
  // The kernel `fn` to call with the op's arguments; under a Recording a stand-in that runs
  // nothing (and returns a value-initialised result).
  template <typename R, typename... A>
  Kernel<R, A...> kernel(R (*fn)(A...)) const {
    return {fn, tally_ != nullptr};
  }
  // Under a Recording: `passes` passes over t's bytes, for arguments handed to the kernel raw.
  void moves(const Tensor& t, int passes) const {
    if (tally_ && t.defined()) moved_ += static_cast<double>(passes) * t.nbytes();
  }

  // An input the kernel reads: f32, bf16 or f16 (read as fp32).
  const float* in(const char* arg, const Tensor& t) const {
    return floating(arg, t, /*read=*/true, /*written=*/false);
  }
  const float* in_opt(const char* arg, const Tensor& t) const {
    return t.defined() ? in(arg, t) : nullptr;
  }
  // An input of which the kernel reads `rows` rows (an embedding table: those of the tokens),
  // recorded as those; and the same of an argument it adds into.
  const float* in_rows(const char* arg, const Tensor& t, int64_t rows) const {
    return rows_of_table(arg, t, rows, /*written=*/false);
  }
  const float* in_rows_opt(const char* arg, const Tensor& t, int64_t rows) const {
    return t.defined() ? in_rows(arg, t, rows) : nullptr;
  }
  float* inout_rows(const char* arg, const Tensor& t, int64_t rows) const {
    return rows_of_table(arg, t, rows, /*written=*/true);
  }
  float* inout_rows_opt(const char* arg, const Tensor& t, int64_t rows) const {
    return t.defined() ? inout_rows(arg, t, rows) : nullptr;
  }
  // An output the kernel assigns: f32, bf16 or f16 (rounded once, after the kernel).
  float* out(const char* arg, const Tensor& t) const {
    return floating(arg, t, /*read=*/false, /*written=*/true);
  }
  float* out_opt(const char* arg, const Tensor& t) const {
    return t.defined() ? out(arg, t) : nullptr;
  }
  // An argument the kernel reads and writes (+=, in place, or only some of its elements).
  float* inout(const char* arg, const Tensor& t) const {
    return floating(arg, t, /*read=*/true, /*written=*/true);
  }
  float* inout_opt(const char* arg, const Tensor& t) const {
    return t.defined() ? inout(arg, t) : nullptr;
  }

  float* f32(const char* arg, const Tensor& t) const {
    LLMT_CHECK(present(t), "op ", name_, ": ", arg, " is required");
    LLMT_CHECK(t.dtype == DType::f32, "op ", name_, ": ", arg, " is ", describe(t),
               ", expected f32");
    moves(t, 1);
    return static_cast<float*>(t.data);
  }
  // nullptr for an absent optional tensor.
  float* f32_opt(const char* arg, const Tensor& t) const {
    return t.defined() ? f32(arg, t) : nullptr;
  }
  int32_t* i32_out(const char* arg, const Tensor& t) const {
    return const_cast<int32_t*>(i32(arg, t));
  }
  const int32_t* i32(const char* arg, const Tensor& t) const {
    LLMT_CHECK(present(t), "op ", name_, ": ", arg, " is required");
    LLMT_CHECK(t.dtype == DType::i32, "op ", name_, ": ", arg, " is ", describe(t),
               ", expected i32");
    moves(t, 1);
    return static_cast<const int32_t*>(t.data);
  }
  // An optional position array (T) i32 (context parallelism's global positions): nullptr when
  // absent, the kernels then use pos_offset + t.
  const int32_t* positions_opt(const char* arg, const Tensor& t, int64_t T) const {
    if (!t.defined()) return nullptr;
    LLMT_CHECK(t.ndim() == 1 && t.size(0) == T, "op ", name_, ": ", arg, " is ", describe(t),
               ", expected (", T, ") positions");
    return i32(arg, t);
  }

  void shape(const char* arg, const Tensor& t, const Shape& s) const {
    LLMT_CHECK(t.shape == s, "op ", name_, ": ", arg, " is ", describe(t), ", expected shape ",
               s.str());
  }
  // Absent, or of shape s.
  void shape_opt(const char* arg, const Tensor& t, const Shape& s) const {
    if (t.defined()) shape(arg, t, s);
  }
  void same_shape(const char* arg, const Tensor& t, const char* ref_arg, const Tensor& ref) const {
    LLMT_CHECK(t.shape == ref.shape, "op ", name_, ": ", arg, " is ", describe(t), " but ", ref_arg,
               " is ", describe(ref));
  }
  void ndim(const char* arg, const Tensor& t, int n) const {
    LLMT_CHECK(t.ndim() == n, "op ", name_, ": ", arg, " is ", describe(t), ", expected ", n,
               " dims");
  }
  void numel(const char* arg, const Tensor& t, int64_t n) const {
    LLMT_CHECK(t.numel() == n, "op ", name_, ": ", arg, " is ", describe(t), ", expected ", n,
               " elements");
  }
  // t is (..., C): returns the number of rows.
  int64_t rows(const char* arg, const Tensor& t, int64_t C) const {
    LLMT_CHECK(t.ndim() >= 1 && t.size(-1) == C && C > 0, "op ", name_, ": ", arg, " is ",
               describe(t), ", expected (..., ", C, ")");
    return t.numel() / C;
  }
  // t (P,C) holds positions [pos_offset, pos_offset + T).
  void positions(const char* arg, const Tensor& t, int64_t C, int64_t pos_offset, int64_t T) const {
    LLMT_CHECK(t.ndim() == 2 && t.size(1) == C && pos_offset >= 0 && t.size(0) >= pos_offset + T,
               "op ", name_, ": ", arg, " is ", describe(t), ", which cannot hold positions [",
               pos_offset, ", ", pos_offset + T, ") of width ", C);
  }
  // A failed check of this op (LLMT_OP_REQUIRE): throws the message after the op's name.
  template <typename... Args>
  [[noreturn]] void fail(const char* file, int line, const char* cond, const Args&... msg) const {
    detail::check_failed(file, line, cond, detail::concat("op ", name_, ": ", msg...));
  }

 private:
  // A 16-bit argument's fp32 copy in scratch slot first + its index.
  struct Widened {
    void* data;
    int64_t numel;
    DType dtype;
    float* scratch;
    bool read, written;
  };
  float* floating(const char* arg, const Tensor& t, bool read, bool written,
                  bool counted = false) const {
    LLMT_CHECK(present(t), "op ", name_, ": ", arg, " is required");
    if (!counted) moves(t, (read ? 1 : 0) + (written ? 1 : 0));
    if (t.dtype == DType::f32) return static_cast<float*>(t.data);
    LLMT_CHECK(is_16bit(t.dtype), "op ", name_, ": ", arg, " is ", describe(t),
               ", expected f32, bf16 or f16");
    if (tally_) return static_cast<float*>(t.data);  // (counted, not widened: no kernel runs)
    Widened* w = nullptr;
    for (Widened& x : widened_)
      if (x.data == t.data && x.numel == t.numel() && x.dtype == t.dtype) w = &x;
    if (!w) {
      const int slot = scratch_slots_in_use++;
      float* scratch = static_cast<float*>(LLMT_KERNEL(*this, op_scratch)(
          slot, static_cast<size_t>(std::max<int64_t>(t.numel(), 1)) * sizeof(float)));
      widened_.push_back({t.data, t.numel(), t.dtype, scratch, false, false});
      w = &widened_.back();
    }
    // Arguments are evaluated before the kernel runs, in any order: whichever asks to read
    // first widens.
    if (read && !w->read)
      LLMT_KERNEL(*this, convert)(w->scratch, DType::f32, w->data, w->dtype, w->numel);
    w->read = w->read || read;
    w->written = w->written || written;
    return w->scratch;
  }

  float* rows_of_table(const char* arg, const Tensor& t, int64_t rows, bool written) const {
    if (tally_ && t.defined() && t.ndim() > 0 && t.size(0) > 0)
      moved_ += static_cast<double>(written ? 2 : 1) * static_cast<double>(rows) *
                static_cast<double>(t.nbytes()) / static_cast<double>(t.size(0));
    return floating(arg, t, /*read=*/true, written, /*counted=*/true);
  }

  const char* name_;
  Device device_;
  bool cuda_ = false;
  mutable std::vector<Widened> widened_;
  OpTally* tally_;            // the Recording's, or null
  mutable double moved_ = 0;  // bytes, under a Recording
};

// The (N, C) split of a row-wise op's input: C = last dim.
struct Rows {
  int64_t N, C;
};

Rows rows_of(const Op& op, const char* arg, const Tensor& t) {
  LLMT_OP_REQUIRE(op, t.ndim() >= 1, arg, " is ", describe(t), ", expected (..., C)");
  int64_t C = t.size(-1);
  return {op.rows(arg, t, C), C};
}

// The scores' scale of an attention call: `scale`, or 1/sqrt(D) when 0 (the default).
float softmax_scale(const Op& op, float scale, int64_t D) {
  LLMT_OP_REQUIRE(op, scale >= 0.0f && std::isfinite(scale), "scale=", scale,
                  " (0 for 1/sqrt(D), or a positive scale)");
  return scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(D));
}

// Shape checks shared by attention forward and backward: qkv (B,T,H+2KV,D), out (B,T,H,D),
// lse (B,H,T); operands a floating-point type.
void check_attention(const Op& op, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                     int64_t H, int64_t KV, DType operands) {
  LLMT_OP_REQUIRE(op, H > 0 && KV > 0 && H % KV == 0, "n_head=", H,
                  " must be a positive multiple of ", "n_kv_head=", KV);
  LLMT_OP_REQUIRE(op, operands == DType::f32 || operands == DType::bf16 || operands == DType::f16,
                  "operands=", dtype_name(operands), ", expected f32, bf16 or f16");
  op.ndim("qkv", qkv, 4);
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(3);
  op.shape("qkv", qkv, {B, T, H + 2 * KV, D});
  op.shape("out", out, {B, T, H, D});
  op.shape("lse", lse, {B, H, T});
}

}  // namespace

// ---- embeddings -------------------------------------------------------------------------------

namespace {

// The vocabulary of an embedding call: wte's rows, or a shard [vocab_start, +Vl) of vocab_size.
int64_t check_vocab_range(const Op& op, int64_t Vl, int64_t vocab_start, int64_t vocab_size) {
  if (vocab_size == 0) {
    LLMT_OP_REQUIRE(op, vocab_start == 0, "vocab_start=", vocab_start, " needs vocab_size");
    return Vl;
  }
  LLMT_OP_REQUIRE(op, vocab_start >= 0 && vocab_start + Vl <= vocab_size, "the shard's rows [",
                  vocab_start, ", ", vocab_start + Vl, ") are outside the vocabulary [0, ",
                  vocab_size, ")");
  return vocab_size;
}

}  // namespace

void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int64_t pos_offset,
                       int64_t vocab_start, int64_t vocab_size, Tensor positions) {
  Op op("embedding_forward", {out, tokens, wte, wpe, positions});
  op.ndim("tokens", tokens, 2);
  op.ndim("wte", wte, 2);
  const int64_t B = tokens.size(0), T = tokens.size(1), Vl = wte.size(0), C = wte.size(1);
  const int64_t V = check_vocab_range(op, Vl, vocab_start, vocab_size);
  op.shape("out", out, {B, T, C});
  if (wpe.defined() && !positions.defined()) op.positions("wpe", wpe, C, pos_offset, T);
  LLMT_KERNEL(op, embedding_forward)
  (op.out("out", out), op.i32("tokens", tokens), op.in_rows("wte", wte, B * T),
   op.in_rows_opt("wpe", wpe, B * T), B, T, C, V, pos_offset,
   op.positions_opt("positions", positions, T), vocab_start, Vl);
}

void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int64_t pos_offset,
                        int64_t vocab_start, int64_t vocab_size, Tensor positions) {
  Op op("embedding_backward", {dwte, dwpe, dout, tokens, positions});
  op.ndim("tokens", tokens, 2);
  op.ndim("dwte", dwte, 2);
  const int64_t B = tokens.size(0), T = tokens.size(1), Vl = dwte.size(0), C = dwte.size(1);
  const int64_t V = check_vocab_range(op, Vl, vocab_start, vocab_size);
  op.shape("dout", dout, {B, T, C});
  if (dwpe.defined() && !positions.defined()) op.positions("dwpe", dwpe, C, pos_offset, T);
  LLMT_KERNEL(op, embedding_backward)
  (op.inout_rows("dwte", dwte, B * T), op.inout_rows_opt("dwpe", dwpe, B * T), op.in("dout", dout),
   op.i32("tokens", tokens), B, T, C, V, pos_offset, op.positions_opt("positions", positions, T),
   vocab_start, Vl);
}

// ---- normalisation ----------------------------------------------------------------------------

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias,
                       float eps) {
  Op op("layernorm_forward", {out, mean, rstd, inp, weight, bias});
  const auto [N, C] = rows_of(op, "inp", inp);
  op.same_shape("out", out, "inp", inp);
  op.numel("mean", mean, N);
  op.numel("rstd", rstd, N);
  op.shape("weight", weight, {C});
  op.shape_opt("bias", bias, {C});
  LLMT_KERNEL(op, layernorm_forward)
  (op.out("out", out), op.f32("mean", mean), op.f32("rstd", rstd), op.in("inp", inp),
   op.in("weight", weight), op.in_opt("bias", bias), N, C, eps);
}

void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                        Tensor weight, Tensor mean, Tensor rstd) {
  Op op("layernorm_backward", {dinp, dweight, dbias, dout, inp, weight, mean, rstd});
  const auto [N, C] = rows_of(op, "inp", inp);
  op.same_shape("dinp", dinp, "inp", inp);
  op.same_shape("dout", dout, "inp", inp);
  op.shape("weight", weight, {C});
  op.shape("dweight", dweight, {C});
  op.shape_opt("dbias", dbias, {C});
  op.numel("mean", mean, N);
  op.numel("rstd", rstd, N);
  LLMT_KERNEL(op, layernorm_backward)
  (op.out("dinp", dinp), op.inout("dweight", dweight), op.inout_opt("dbias", dbias),
   op.in("dout", dout), op.in("inp", inp), op.in("weight", weight), op.f32("mean", mean),
   op.f32("rstd", rstd), N, C);
}

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps) {
  Op op("rmsnorm_forward", {out, rstd, inp, weight});
  const auto [N, C] = rows_of(op, "inp", inp);
  op.same_shape("out", out, "inp", inp);
  op.numel("rstd", rstd, N);
  op.shape("weight", weight, {C});
  LLMT_KERNEL(op, rmsnorm_forward)
  (op.out("out", out), op.f32("rstd", rstd), op.in("inp", inp), op.in("weight", weight), N, C, eps);
}

void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight,
                      Tensor rstd) {
  Op op("rmsnorm_backward", {dinp, dweight, dout, inp, weight, rstd});
  const auto [N, C] = rows_of(op, "inp", inp);
  op.same_shape("dinp", dinp, "inp", inp);
  op.same_shape("dout", dout, "inp", inp);
  op.shape("weight", weight, {C});
  op.shape("dweight", dweight, {C});
  op.numel("rstd", rstd, N);
  LLMT_KERNEL(op, rmsnorm_backward)
  (op.out("dinp", dinp), op.inout("dweight", dweight), op.in("dout", dout), op.in("inp", inp),
   op.in("weight", weight), op.f32("rstd", rstd), N, C);
}

// ---- linear (GEMM) ----------------------------------------------------------------------------

namespace {

// The type a GEMM's inputs are representable in: a floating-point compute type.
void gemm_operands(const Op& op, DType t) {
  LLMT_OP_REQUIRE(op, t == DType::f32 || t == DType::bf16 || t == DType::f16,
                  "operands must be f32, bf16 or f16, not ", dtype_name(t));
}

}  // namespace

void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, DType operands) {
  Op op("linear_forward", {out, inp, weight, bias});
  gemm_operands(op, operands);
  op.ndim("weight", weight, 2);
  const int64_t OC = weight.size(0), IC = weight.size(1);
  const int64_t N = op.rows("inp", inp, IC);
  LLMT_OP_REQUIRE(op, op.rows("out", out, OC) == N, "out ", describe(out), " and inp ",
                  describe(inp), " have different row counts");
  op.shape_opt("bias", bias, {OC});
  LLMT_KERNEL(op, linear_forward)
  (op.out("out", out), op.in("inp", inp), op.in("weight", weight), op.in_opt("bias", bias), N, IC,
   OC, operands);
}

void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                     Tensor weight, DType operands) {
  Op op("linear_backward", {dinp, dweight, dbias, dout, inp, weight});
  gemm_operands(op, operands);
  // Only the GEMMs' inputs are required: weight for dinp, inp for dweight (the two halves run
  // apart under zero-bubble schedules and tensor parallelism).
  LLMT_OP_REQUIRE(op, !dinp.defined() || weight.defined(), "dinp needs weight");
  LLMT_OP_REQUIRE(op, !dweight.defined() || inp.defined(), "dweight needs inp");
  const Tensor& w = weight.defined() ? weight : dweight;  // (OC,IC)
  LLMT_OP_REQUIRE(op, w.defined() || (dbias.defined() && !inp.defined()),
                  "weight, or dweight, or dbias alone is required");
  if (w.defined()) op.ndim(weight.defined() ? "weight" : "dweight", w, 2);
  const int64_t OC = w.defined() ? w.size(0) : dbias.numel();
  const int64_t N = op.rows("dout", dout, OC);
  if (w.defined()) {
    const int64_t IC = w.size(1);
    if (inp.defined())
      LLMT_OP_REQUIRE(op, op.rows("inp", inp, IC) == N, "dout ", describe(dout), " and inp ",
                      describe(inp), " have different row counts");
    if (dinp.defined())
      LLMT_OP_REQUIRE(op, op.rows("dinp", dinp, IC) == N, "dout ", describe(dout), " and dinp ",
                      describe(dinp), " have different row counts");
    if (dinp.defined() && inp.defined()) op.same_shape("dinp", dinp, "inp", inp);
  }
  const int64_t IC = w.defined() ? w.size(1) : 0;
  op.shape_opt("dweight", dweight, {OC, IC});
  op.shape_opt("dbias", dbias, {OC});
  LLMT_KERNEL(op, linear_backward)
  (op.out_opt("dinp", dinp), op.inout_opt("dweight", dweight), op.inout_opt("dbias", dbias),
   op.in("dout", dout), op.in_opt("inp", inp), op.in_opt("weight", weight), N, IC, OC, operands);
}

// ---- activations ------------------------------------------------------------------------------

void gelu_forward(Tensor out, Tensor inp) {
  Op op("gelu_forward", {out, inp});
  op.same_shape("out", out, "inp", inp);
  LLMT_KERNEL(op, gelu_forward)(op.out("out", out), op.in("inp", inp), inp.numel());
}

void gelu_backward(Tensor dinp, Tensor dout, Tensor inp) {
  Op op("gelu_backward", {dinp, dout, inp});
  op.same_shape("dinp", dinp, "inp", inp);
  op.same_shape("dout", dout, "inp", inp);
  LLMT_KERNEL(op, gelu_backward)
  (op.out("dinp", dinp), op.in("dout", dout), op.in("inp", inp), inp.numel());
}

void swiglu_forward(Tensor out, Tensor inp) {
  Op op("swiglu_forward", {out, inp});
  const auto [N, F2] = rows_of(op, "inp", inp);
  LLMT_OP_REQUIRE(op, F2 % 2 == 0, "inp ", describe(inp), " must be (..., 2F) = [gate | up]");
  LLMT_OP_REQUIRE(op, op.rows("out", out, F2 / 2) == N, "out ", describe(out),
                  " must be (..., F) for inp ", describe(inp));
  LLMT_KERNEL(op, swiglu_forward)(op.out("out", out), op.in("inp", inp), N, F2 / 2);
}

void swiglu_backward(Tensor dinp, Tensor dout, Tensor inp) {
  Op op("swiglu_backward", {dinp, dout, inp});
  const auto [N, F2] = rows_of(op, "inp", inp);
  LLMT_OP_REQUIRE(op, F2 % 2 == 0, "inp ", describe(inp), " must be (..., 2F) = [gate | up]");
  op.same_shape("dinp", dinp, "inp", inp);
  LLMT_OP_REQUIRE(op, op.rows("dout", dout, F2 / 2) == N, "dout ", describe(dout),
                  " must be (..., F) for inp ", describe(inp));
  LLMT_KERNEL(op, swiglu_backward)
  (op.out("dinp", dinp), op.in("dout", dout), op.in("inp", inp), N, F2 / 2);
}

// ---- rotary position embedding ----------------------------------------------------------------

namespace {

// x (B,T,HT,D), 0 <= n_rot <= HT, the rotated dims an even run inside D (count 0: all D, even);
// returns the dims and the rotated run.
std::array<int64_t, 6> check_rope(const Op& op, const Tensor& x, int64_t n_rot, int64_t pos_offset,
                                  float theta, RopeDims dims, const RopeScaling& s) {
  op.ndim("x", x, 4);
  const int64_t D = x.size(3), R = dims.count == 0 ? D : dims.count;
  LLMT_OP_REQUIRE(op, R % 2 == 0 && R > 0 && dims.first >= 0 && dims.first + R <= D,
                  "rotated dims [", dims.first, ", +", R, ") of x ", describe(x),
                  " are not an even run inside the head dim");
  LLMT_OP_REQUIRE(op, 0 <= n_rot && n_rot <= x.size(2), "n_rot_heads=", n_rot, " is outside [0, ",
                  x.size(2), "] for x ", describe(x));
  LLMT_OP_REQUIRE(op, pos_offset >= 0 && theta > 0.0f, "pos_offset=", pos_offset, " theta=", theta);
  const bool by_context = s.rope_type == RopeType::llama3 || s.rope_type == RopeType::yarn;
  LLMT_OP_REQUIRE(op,
                  s.factor >= 1.0f && (!by_context || s.original_max_position_embeddings > 0) &&
                      (s.rope_type != RopeType::llama3 || s.high_freq_factor > s.low_freq_factor),
                  "rope scaling ", static_cast<int>(s.rope_type), ": factor ", s.factor,
                  ", original context ", s.original_max_position_embeddings, ", low/high ",
                  s.low_freq_factor, "/", s.high_freq_factor);
  return {x.size(0), x.size(1), x.size(2), D, dims.first, R};
}

}  // namespace

void rope_forward(Tensor x, int64_t n_rot_heads, int64_t pos_offset, float theta, Tensor positions,
                  RopeDims dims, const RopeScaling& scaling) {
  Op op("rope_forward", {x, positions});
  const auto [B, T, HT, D, r0, R] =
      check_rope(op, x, n_rot_heads, pos_offset, theta, dims, scaling);
  LLMT_KERNEL(op, rope_forward)
  (op.inout("x", x), B, T, HT, D, n_rot_heads, r0, R, pos_offset,
   op.positions_opt("positions", positions, T), theta, scaling);
}

void rope_backward(Tensor dx, int64_t n_rot_heads, int64_t pos_offset, float theta,
                   Tensor positions, RopeDims dims, const RopeScaling& scaling) {
  Op op("rope_backward", {dx, positions});
  const auto [B, T, HT, D, r0, R] =
      check_rope(op, dx, n_rot_heads, pos_offset, theta, dims, scaling);
  LLMT_KERNEL(op, rope_backward)
  (op.inout("dx", dx), B, T, HT, D, n_rot_heads, r0, R, pos_offset,
   op.positions_opt("positions", positions, T), theta, scaling);
}

// ---- attention --------------------------------------------------------------------------------

void attention_forward(Tensor out, Tensor lse, Tensor qkv, int64_t n_head, int64_t n_kv_head,
                       DType operands, float scale) {
  Op op("attention_forward", {out, lse, qkv});
  check_attention(op, out, lse, qkv, n_head, n_kv_head, operands);
  LLMT_KERNEL(op, attention_forward)
  (op.out("out", out), op.f32("lse", lse), op.in("qkv", qkv), qkv.size(0), qkv.size(1), n_head,
   n_kv_head, qkv.size(3), operands, softmax_scale(op, scale, qkv.size(3)));
}

void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse,
                        int64_t n_head, int64_t n_kv_head, DType operands, float scale) {
  Op op("attention_backward", {dqkv, dout, qkv, out, lse});
  check_attention(op, out, lse, qkv, n_head, n_kv_head, operands);
  op.same_shape("dqkv", dqkv, "qkv", qkv);
  op.same_shape("dout", dout, "out", out);
  LLMT_KERNEL(op, attention_backward)
  (op.out("dqkv", dqkv), op.in("dout", dout), op.in("qkv", qkv), op.in("out", out),
   op.f32("lse", lse), qkv.size(0), qkv.size(1), n_head, n_kv_head, qkv.size(3), operands,
   softmax_scale(op, scale, qkv.size(3)));
}

// ---- attention blocks (context parallelism) -----------------------------------------------------
namespace {

// q_src (B,Tq,Wq,D) with H query heads, kv_src (B,Tk,Wk,D) with 2KV heads from kv0, out
// (B,Tq,H,D), lse (B,H,Tq), positions (Tq) and (Tk).
struct BlockDims {
  int64_t B, Tq, Tk, Wq, Wk, D;
};
BlockDims check_block(const Op& op, const Tensor& out, const Tensor& lse, const Tensor& q_src,
                      const Tensor& kv_src, int64_t kv0, const Tensor& q_pos, const Tensor& k_pos,
                      int64_t H, int64_t KV) {
  LLMT_OP_REQUIRE(op, H > 0 && KV > 0 && H % KV == 0, "n_head=", H,
                  " must be a positive multiple of ", "n_kv_head=", KV);
  op.ndim("q_src", q_src, 4);
  op.ndim("kv_src", kv_src, 4);
  const BlockDims d{q_src.size(0), q_src.size(1),  kv_src.size(1),
                    q_src.size(2), kv_src.size(2), q_src.size(3)};
  LLMT_OP_REQUIRE(op, d.Wq >= H, "q_src ", describe(q_src), " holds fewer than n_head=", H,
                  " heads");
  LLMT_OP_REQUIRE(op, kv0 >= 0 && kv0 + 2 * KV <= d.Wk, "kv_src ", describe(kv_src),
                  " has no heads [", kv0, ", ", kv0 + 2 * KV, ") for n_kv_head=", KV);
  op.shape("kv_src", kv_src, {d.B, d.Tk, d.Wk, d.D});
  op.shape("out", out, {d.B, d.Tq, H, d.D});
  op.shape("lse", lse, {d.B, H, d.Tq});
  LLMT_OP_REQUIRE(op, q_pos.defined() && k_pos.defined(), "q_pos and k_pos are required");
  return d;
}

}  // namespace

void attention_block_forward(Tensor out, Tensor lse, Tensor q_src, Tensor kv_src, int64_t kv0,
                             Tensor q_pos, Tensor k_pos, int64_t n_head, int64_t n_kv_head,
                             float scale) {
  Op op("attention_block_forward", {out, lse, q_src, kv_src, q_pos, k_pos});
  const BlockDims d =
      check_block(op, out, lse, q_src, kv_src, kv0, q_pos, k_pos, n_head, n_kv_head);
  LLMT_KERNEL(op, attention_block_forward)
  (op.out("out", out), op.f32("lse", lse), op.in("q_src", q_src), d.Wq, op.in("kv_src", kv_src),
   d.Wk, kv0, op.positions_opt("q_pos", q_pos, d.Tq), op.positions_opt("k_pos", k_pos, d.Tk), d.B,
   d.Tq, d.Tk, n_head, n_kv_head, d.D, softmax_scale(op, scale, d.D));
}

void attention_block_backward(Tensor dq_src, Tensor dkv_src, Tensor dout, Tensor q_src,
                              Tensor kv_src, int64_t kv0, Tensor out, Tensor lse, Tensor q_pos,
                              Tensor k_pos, int64_t n_head, int64_t n_kv_head, float scale) {
  Op op("attention_block_backward", {dq_src, dkv_src, dout, q_src, kv_src, out, lse, q_pos, k_pos});
  const BlockDims d =
      check_block(op, out, lse, q_src, kv_src, kv0, q_pos, k_pos, n_head, n_kv_head);
  op.same_shape("dq_src", dq_src, "q_src", q_src);
  op.same_shape("dkv_src", dkv_src, "kv_src", kv_src);
  op.same_shape("dout", dout, "out", out);
  LLMT_KERNEL(op, attention_block_backward)
  (op.inout("dq_src", dq_src), op.inout("dkv_src", dkv_src), op.in("dout", dout),
   op.in("q_src", q_src), d.Wq, op.in("kv_src", kv_src), d.Wk, kv0, op.in("out", out),
   op.f32("lse", lse), op.positions_opt("q_pos", q_pos, d.Tq),
   op.positions_opt("k_pos", k_pos, d.Tk), d.B, d.Tq, d.Tk, n_head, n_kv_head, d.D,
   softmax_scale(op, scale, d.D));
}

void attention_merge(Tensor out, Tensor lse, Tensor part_out, Tensor part_lse) {
  Op op("attention_merge", {out, lse, part_out, part_lse});
  op.ndim("out", out, 4);
  const int64_t B = out.size(0), T = out.size(1), H = out.size(2), D = out.size(3);
  op.shape("lse", lse, {B, H, T});
  op.same_shape("part_out", part_out, "out", out);
  op.same_shape("part_lse", part_lse, "lse", lse);
  LLMT_KERNEL(op, attention_merge)
  (op.inout("out", out), op.f32("lse", lse), op.in("part_out", part_out),
   op.f32("part_lse", part_lse), B, T, H, D);
}

void copy_heads(Tensor dst, int64_t dst_head, Tensor src, int64_t src_head, int64_t n_heads) {
  Op op("copy_heads", {dst, src});
  op.ndim("dst", dst, 4);
  op.ndim("src", src, 4);
  const int64_t N = dst.size(0) * dst.size(1), D = dst.size(3);
  LLMT_OP_REQUIRE(op, src.size(0) * src.size(1) == N && src.size(3) == D, "src ", describe(src),
                  " and dst ", describe(dst), " differ in rows or head dim");
  LLMT_OP_REQUIRE(op,
                  n_heads >= 0 && dst_head >= 0 && src_head >= 0 &&
                      dst_head + n_heads <= dst.size(2) && src_head + n_heads <= src.size(2),
                  "heads [", src_head, ", +", n_heads, ") of src ", describe(src), " -> [",
                  dst_head, ", +", n_heads, ") of dst ", describe(dst));
  LLMT_KERNEL(op, copy_heads)
  (op.inout("dst", dst), dst.size(2), dst_head, op.in("src", src), src.size(2), src_head, n_heads,
   N, D);
}

void copy_blocks(Tensor dst, Tensor src, const ColumnBlocks& b, bool add) {
  Op op("copy_blocks", {dst, src});
  op.ndim("dst", dst, 2);
  op.ndim("src", src, 2);
  const int64_t rows = dst.size(0), Wd = dst.size(1), Ws = src.size(1);
  LLMT_OP_REQUIRE(op, src.size(0) == rows, "src ", describe(src), " and dst ", describe(dst),
                  " differ in rows");
  auto inside = [&](int64_t first, int64_t stride, int64_t W) {
    return b.n == 0 || b.width == 0 ||
           (first >= 0 && stride >= 0 && first + (b.n - 1) * stride + b.width <= W);
  };
  LLMT_OP_REQUIRE(op, b.n >= 0 && b.width >= 0 && inside(b.dst_first, b.dst_stride, Wd), b.n,
                  " blocks of ", b.width, " at ", b.dst_first, " + j*", b.dst_stride,
                  " run outside dst ", describe(dst));
  LLMT_OP_REQUIRE(op, inside(b.src_first, b.src_stride, Ws), b.n, " blocks of ", b.width, " at ",
                  b.src_first, " + j*", b.src_stride, " run outside src ", describe(src));
  LLMT_OP_REQUIRE(op, add || b.n <= 1 || b.dst_stride >= b.width, "blocks of ", b.width,
                  " written ", b.dst_stride,
                  " apart overlap in dst: only a sum (add) may gather blocks into one");
  LLMT_KERNEL(op, copy_blocks)
  (op.inout("dst", dst), Wd, op.in("src", src), Ws, rows, b.n, b.width, b.dst_first, b.dst_stride,
   b.src_first, b.src_stride, add);
}

// ---- mixture of experts -----------------------------------------------------------------------

void moe_route(Tensor scores, Tensor idx, Tensor weights, Tensor logits, const MoeRouting& r,
               Tensor bias) {
  Op op("moe_route", {scores, idx, weights, logits, bias});
  op.ndim("logits", logits, 2);
  op.ndim("idx", idx, 2);
  const int64_t N = logits.size(0), E = logits.size(1), k = idx.size(1), G = r.groups;
  LLMT_OP_REQUIRE(op, G >= 1 && E % G == 0 && r.topk_group >= 1 && r.topk_group <= G, E,
                  " experts in ", G, " groups, ", r.topk_group, " of them picked");
  LLMT_OP_REQUIRE(op, k >= 1 && k <= r.topk_group * (E / G), "top k=", k, " of ",
                  r.topk_group * (E / G), " experts (", r.topk_group, " of ", G, " groups of E=", E,
                  ")");
  op.shape("scores", scores, {N, E});
  op.shape("idx", idx, {N, k});
  op.shape("weights", weights, {N, k});
  op.shape_opt("bias", bias, {E});
  LLMT_KERNEL(op, moe_route)
  (op.f32("scores", scores), op.i32_out("idx", idx), op.f32("weights", weights),
   op.f32("logits", logits), op.in_opt("bias", bias), N, E, k, r.sigmoid, r.normalize, G,
   r.topk_group, r.scale);
}

void moe_dispatch(Tensor counts, Tensor offsets, Tensor assign, Tensor slot, Tensor idx,
                  int64_t seq_len, int64_t capacity, Tensor rank_base) {
  Op op("moe_dispatch", {counts, offsets, assign, slot, idx, rank_base});
  op.ndim("idx", idx, 2);
  op.ndim("counts", counts, 2);
  const int64_t N = idx.size(0), k = idx.size(1), E = counts.size(1);
  LLMT_OP_REQUIRE(op, seq_len >= 1 && N % seq_len == 0, N, " rows are not sequences of ", seq_len);
  LLMT_OP_REQUIRE(op, capacity >= 0, "capacity=", capacity);
  const int64_t S = N / seq_len;
  op.shape("counts", counts, {S, E});
  op.shape("offsets", offsets, {E + 1});
  op.shape("assign", assign, {N * k});
  op.shape("slot", slot, {N, k});
  int64_t H = 1;
  if (rank_base.defined()) {
    op.ndim("rank_base", rank_base, 4);
    H = rank_base.size(3);
    op.shape("rank_base", rank_base, {S, E, k, H});
    LLMT_OP_REQUIRE(op, H >= 1 && seq_len % H == 0, "seq_len ", seq_len, " is not ", H,
                    " equal runs");
  }
  LLMT_KERNEL(op, moe_dispatch)
  (op.i32_out("counts", counts), op.i32_out("offsets", offsets), op.i32_out("assign", assign),
   op.i32_out("slot", slot), op.i32("idx", idx),
   rank_base.defined() ? op.i32("rank_base", rank_base) : nullptr, S, seq_len, E, k, H, capacity);
}

void moe_permute(Tensor out, Tensor in, Tensor assign, Tensor weights) {
  Op op("moe_permute", {out, in, assign, weights});
  const auto [N, C] = rows_of(op, "in", in);
  LLMT_OP_REQUIRE(op, assign.ndim() == 1 && N > 0 && assign.size(0) % N == 0, "assign ",
                  describe(assign), " is not k rows per token of ", describe(in));
  const int64_t k = assign.size(0) / N;
  op.shape("out", out, {N * k, C});
  op.shape_opt("weights", weights, {N, k});
  LLMT_KERNEL(op, moe_permute)
  (op.inout("out", out), op.in("in", in), op.i32("assign", assign), op.f32_opt("weights", weights),
   N, C, k);
}

void moe_unpermute(Tensor out, Tensor in, Tensor slot, Tensor weights) {
  Op op("moe_unpermute", {out, in, slot, weights});
  op.ndim("slot", slot, 2);
  const int64_t N = slot.size(0), k = slot.size(1);
  const int64_t C = out.size(-1);
  op.shape("out", out, {N, C});
  op.shape("in", in, {N * k, C});
  op.shape_opt("weights", weights, {N, k});
  LLMT_KERNEL(op, moe_unpermute)
  (op.out("out", out), op.in("in", in), op.i32("slot", slot), op.f32_opt("weights", weights), N, C,
   k);
}

void moe_weights_backward(Tensor dweights, Tensor dout, Tensor in, Tensor slot) {
  Op op("moe_weights_backward", {dweights, dout, in, slot});
  op.ndim("slot", slot, 2);
  const int64_t N = slot.size(0), k = slot.size(1), C = dout.size(-1);
  op.shape("dout", dout, {N, C});
  op.shape("in", in, {N * k, C});
  op.shape("dweights", dweights, {N, k});
  LLMT_KERNEL(op, moe_weights_backward)
  (op.f32("dweights", dweights), op.in("dout", dout), op.in("in", in), op.i32("slot", slot), N, C,
   k);
}

void moe_route_backward(Tensor dlogits, Tensor dweights, Tensor logits, Tensor idx, Tensor counts,
                        const MoeRouting& r, float aux_scale, float z_scale) {
  Op op("moe_route_backward", {dlogits, dweights, logits, idx, counts});
  op.ndim("logits", logits, 2);
  op.ndim("idx", idx, 2);
  const int64_t N = logits.size(0), E = logits.size(1), k = idx.size(1);
  op.shape("dlogits", dlogits, {N, E});
  op.shape("dweights", dweights, {N, k});
  op.shape("idx", idx, {N, k});
  int64_t T = N;
  if (aux_scale != 0.0f) {
    op.ndim("counts", counts, 2);
    LLMT_OP_REQUIRE(op, counts.size(1) == E && counts.size(0) >= 1 && N % counts.size(0) == 0,
                    "counts ", describe(counts), " is not (S,E) for ", N, " rows of ", E,
                    " experts");
    T = N / counts.size(0);
  }
  LLMT_KERNEL(op, moe_route_backward)
  (op.f32("dlogits", dlogits), op.f32("dweights", dweights), op.f32("logits", logits),
   op.i32("idx", idx), aux_scale != 0.0f ? op.i32("counts", counts) : nullptr, N, T, E, k,
   r.sigmoid, r.normalize, r.scale, aux_scale, z_scale);
}

void moe_route_losses(Tensor aux, Tensor zsq, Tensor logits, Tensor counts, int64_t k,
                      bool sigmoid) {
  Op op("moe_route_losses", {aux, zsq, logits, counts});
  op.ndim("logits", logits, 2);
  op.ndim("counts", counts, 2);
  const int64_t N = logits.size(0), E = logits.size(1), S = counts.size(0);
  LLMT_OP_REQUIRE(op, S >= 1 && N % S == 0 && counts.size(1) == E && k >= 1, "counts ",
                  describe(counts), " is not (S,E) for ", N, " rows of ", E, " experts");
  op.shape("aux", aux, {S});
  op.shape("zsq", zsq, {N});
  LLMT_KERNEL(op, moe_route_losses)
  (op.f32("aux", aux), op.f32("zsq", zsq), op.f32("logits", logits), op.i32("counts", counts), S,
   N / S, E, k, sigmoid);
}

namespace {

// Checks a grouped GEMM's offsets (G+1 host values, non-decreasing within [0, M]) and weight
// indices (G values below W, or none with G = W); returns G.
int64_t check_groups(const Op& op, std::span<const int64_t> offsets,
                     std::span<const int64_t> weight_of, int64_t W, int64_t M) {
  LLMT_OP_REQUIRE(op, !offsets.empty(), "no offsets");
  const int64_t G = static_cast<int64_t>(offsets.size()) - 1;
  if (weight_of.empty())
    LLMT_OP_REQUIRE(op, G == W, offsets.size(), " offsets for W=", W, " weights, expected W+1");
  else
    LLMT_OP_REQUIRE(op, static_cast<int64_t>(weight_of.size()) == G, weight_of.size(),
                    " weight indices for ", G, " groups");
  for (int64_t g = 0; g < G; ++g) {
    LLMT_OP_REQUIRE(op, offsets[g] >= 0 && offsets[g] <= offsets[g + 1] && offsets[g + 1] <= M,
                    "group ", g, " rows [", offsets[g], ", ", offsets[g + 1], ") outside [0, ", M,
                    ")");
    if (!weight_of.empty())
      LLMT_OP_REQUIRE(op, weight_of[g] >= 0 && weight_of[g] < W, "group ", g, " uses weight ",
                      weight_of[g], " of ", W);
  }
  return G;
}

}  // namespace

void grouped_linear_forward(Tensor out, Tensor inp, Tensor weight, std::span<const int64_t> offsets,
                            std::span<const int64_t> weight_of, DType operands) {
  Op op("grouped_linear_forward", {out, inp, weight});
  gemm_operands(op, operands);
  op.ndim("weight", weight, 3);
  const int64_t W = weight.size(0), OC = weight.size(1), IC = weight.size(2);
  op.ndim("inp", inp, 2);
  const int64_t M = inp.size(0);
  op.shape("inp", inp, {M, IC});
  op.shape("out", out, {M, OC});
  const int64_t G = check_groups(op, offsets, weight_of, W, M);
  LLMT_KERNEL(op, grouped_linear_forward)
  (op.inout("out", out), op.in("inp", inp), op.in("weight", weight), offsets.data(),
   weight_of.empty() ? nullptr : weight_of.data(), G, W, IC, OC, operands);
}

void grouped_linear_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight,
                             std::span<const int64_t> offsets, std::span<const int64_t> weight_of,
                             DType operands) {
  Op op("grouped_linear_backward", {dinp, dweight, dout, inp, weight});
  gemm_operands(op, operands);
  op.ndim("dout", dout, 2);
  const int64_t M = dout.size(0), OC = dout.size(1);
  const Tensor& w = weight.defined() ? weight : dweight;
  op.ndim("weight", w, 3);
  const int64_t W = w.size(0), IC = w.size(2);
  op.shape("weight", w, {W, OC, IC});
  if (dinp.defined()) {
    op.shape("weight", weight, {W, OC, IC});
    op.shape("dinp", dinp, {M, IC});
  }
  if (dweight.defined()) {
    op.shape("dweight", dweight, {W, OC, IC});
    op.shape("inp", inp, {M, IC});
  }
  const int64_t G = check_groups(op, offsets, weight_of, W, M);
  LLMT_KERNEL(op, grouped_linear_backward)
  (op.inout_opt("dinp", dinp), op.inout_opt("dweight", dweight), op.in("dout", dout),
   dweight.defined() ? op.in("inp", inp) : nullptr,
   dinp.defined() ? op.in("weight", weight) : nullptr, offsets.data(),
   weight_of.empty() ? nullptr : weight_of.data(), G, W, IC, OC, operands);
}

// ---- elementwise ------------------------------------------------------------------------------

void add(Tensor out, Tensor a, Tensor b) {
  Op op("add", {out, a, b});
  op.same_shape("out", out, "a", a);
  op.same_shape("b", b, "a", a);
  LLMT_KERNEL(op, add)(op.out("out", out), op.in("a", a), op.in("b", b), a.numel());
}

void add_inplace(Tensor dst, Tensor src) {
  Op op("add_inplace", {dst, src});
  op.same_shape("dst", dst, "src", src);
  LLMT_KERNEL(op, add_inplace)(op.inout("dst", dst), op.in("src", src), src.numel());
}

void scale_inplace(Tensor x, float s) {
  Op op("scale_inplace", {x});
  LLMT_KERNEL(op, scale_inplace)(op.inout("x", x), s, x.numel());
}

void add_bias(Tensor x, Tensor bias) {
  Op op("add_bias", {x, bias});
  op.ndim("bias", bias, 1);
  const int64_t C = bias.size(0);
  const int64_t N = op.rows("x", x, C);
  LLMT_KERNEL(op, add_bias)(op.inout("x", x), op.in("bias", bias), N, C);
}

void copy(Tensor dst, Tensor src) {
  Op op("copy", {dst, src}, /*mixed_devices=*/true);
  op.same_shape("dst", dst, "src", src);
  LLMT_OP_REQUIRE(op, dst.dtype == src.dtype, "dst ", describe(dst), " and src ", describe(src),
                  " differ in dtype (use convert)");
  LLMT_OP_REQUIRE(op, present(dst) && present(src), "dst and src are required");
  op.moves(dst, 1);
  op.moves(src, 1);
  LLMT_KERNEL(op, copy_bytes)(dst.data, src.data, src.nbytes());
}

void fill_zero(Tensor x) {
  Op op("fill_zero", {x});
  LLMT_OP_REQUIRE(op, present(x), "x is required");
  op.moves(x, 1);
  LLMT_KERNEL(op, fill_zero)(x.data, x.nbytes());
}

void fill(Tensor x, float value) {
  Op op("fill", {x});
  LLMT_KERNEL(op, fill)(op.out("x", x), value, x.numel());
}

namespace {

void check_dropout(const Op& op, float p, int64_t global_offset) {
  LLMT_OP_REQUIRE(op, p >= 0.0f && p < 1.0f, "p=", p, " must be in [0, 1)");
  LLMT_OP_REQUIRE(op, global_offset >= 0, "global_offset=", global_offset, " must be >= 0");
}

}  // namespace

void dropout_forward(Tensor out, Tensor inp, float p, uint64_t seed, uint64_t stream,
                     int64_t global_offset) {
  Op op("dropout_forward", {out, inp});
  op.same_shape("out", out, "inp", inp);
  check_dropout(op, p, global_offset);
  LLMT_KERNEL(op, dropout)
  (op.out("out", out), op.in("inp", inp), inp.numel(), p, seed, stream, global_offset);
}

void dropout_backward(Tensor dinp, Tensor dout, float p, uint64_t seed, uint64_t stream,
                      int64_t global_offset) {
  Op op("dropout_backward", {dinp, dout});
  op.same_shape("dinp", dinp, "dout", dout);
  check_dropout(op, p, global_offset);
  LLMT_KERNEL(op, dropout)
  (op.out("dinp", dinp), op.in("dout", dout), dout.numel(), p, seed, stream, global_offset);
}

// ---- loss -------------------------------------------------------------------------------------

void softmax_cross_entropy(Tensor losses, Tensor dlogits, Tensor logits, Tensor targets,
                           float dloss) {
  Op op("softmax_cross_entropy", {losses, dlogits, logits, targets});
  const auto [N, V] = rows_of(op, "logits", logits);
  op.numel("losses", losses, N);
  op.numel("targets", targets, N);
  if (dlogits.defined()) op.same_shape("dlogits", dlogits, "logits", logits);
  LLMT_KERNEL(op, softmax_cross_entropy)
  (op.f32("losses", losses), op.out_opt("dlogits", dlogits), op.in("logits", logits),
   op.i32("targets", targets), N, V, dloss);
}

namespace {

// logits (N,Vl), targets (N), a shard [vocab_start, +Vl) of some vocabulary: returns {N, Vl}.
Rows check_ce_shard(const Op& op, const Tensor& logits, const Tensor& targets,
                    int64_t vocab_start) {
  const Rows r = rows_of(op, "logits", logits);
  op.numel("targets", targets, r.N);
  LLMT_OP_REQUIRE(op, vocab_start >= 0, "vocab_start=", vocab_start, " must be >= 0");
  return r;
}

}  // namespace

void cross_entropy_shard_max(Tensor max, Tensor logits, Tensor targets, int64_t vocab_size) {
  Op op("cross_entropy_shard_max", {max, logits, targets});
  const auto [N, Vl] = check_ce_shard(op, logits, targets, 0);
  op.numel("max", max, N);
  LLMT_OP_REQUIRE(op, vocab_size >= Vl, "vocab_size=", vocab_size, " is smaller than the shard's ",
                  Vl);
  LLMT_KERNEL(op, cross_entropy_shard_max)
  (op.f32("max", max), op.in("logits", logits), op.i32("targets", targets), N, Vl, vocab_size);
}

void cross_entropy_shard_sums(Tensor sums, Tensor logits, Tensor max, Tensor targets,
                              int64_t vocab_start) {
  Op op("cross_entropy_shard_sums", {sums, logits, max, targets});
  const auto [N, Vl] = check_ce_shard(op, logits, targets, vocab_start);
  op.numel("max", max, N);
  op.shape("sums", sums, {2, N});
  LLMT_KERNEL(op, cross_entropy_shard_sums)
  (op.f32("sums", sums), op.in("logits", logits), op.f32("max", max), op.i32("targets", targets), N,
   Vl, vocab_start);
}

void cross_entropy_shard_finish(Tensor losses, Tensor dlogits, Tensor logits, Tensor max,
                                Tensor sums, Tensor targets, int64_t vocab_start, float dloss) {
  Op op("cross_entropy_shard_finish", {losses, dlogits, logits, max, sums, targets});
  const auto [N, Vl] = check_ce_shard(op, logits, targets, vocab_start);
  op.numel("losses", losses, N);
  op.numel("max", max, N);
  op.shape("sums", sums, {2, N});
  if (dlogits.defined()) op.same_shape("dlogits", dlogits, "logits", logits);
  LLMT_KERNEL(op, cross_entropy_shard_finish)
  (op.f32("losses", losses), op.out_opt("dlogits", dlogits), op.in("logits", logits),
   op.f32("max", max), op.f32("sums", sums), op.i32("targets", targets), N, Vl, vocab_start, dloss);
}

// ---- optimizer and reductions -----------------------------------------------------------------

void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& hp) {
  Op op("adamw_update", {param, grad, m, v});
  op.same_shape("grad", grad, "param", param);
  op.same_shape("m", m, "param", param);
  op.same_shape("v", v, "param", param);
  LLMT_OP_REQUIRE(op, hp.step >= 1, "step=", hp.step, " must be >= 1 (1-based)");
  LLMT_KERNEL(op, adamw_update)
  (op.f32("param", param), op.in("grad", grad), op.f32("m", m), op.f32("v", v), param.numel(),
   hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.step, hp.grad_scale);
}

namespace {

// 16-bit gradients (train.grad_dtype = "compute") are reduced in pieces of this many elements,
// each widened through the op's scratch, so the scratch stays small whatever the tensor.
constexpr int64_t kReducePiece = int64_t{1} << 20;

bool any_16bit(std::span<const Tensor> xs) {
  return std::any_of(xs.begin(), xs.end(), [](const Tensor& x) { return is_16bit(x.dtype); });
}

}  // namespace

double sum_squares(Tensor x) {
  if (is_16bit(x.dtype) && x.numel() > kReducePiece) {
    // The pieces' sums added in order: deterministic.
    const Tensor flat = x.view({x.numel()});
    double sum = 0;
    for (int64_t b = 0; b < x.numel(); b += kReducePiece)
      sum += sum_squares(flat.rows(b, std::min(x.numel(), b + kReducePiece)));
    return sum;
  }
  Op op("sum_squares", {x});
  return LLMT_KERNEL(op, sum_squares)(op.in("x", x), x.numel());
}

bool has_nonfinite(Tensor x) {
  if (is_16bit(x.dtype) && x.numel() > kReducePiece) {
    const Tensor flat = x.view({x.numel()});
    for (int64_t b = 0; b < x.numel(); b += kReducePiece)
      if (has_nonfinite(flat.rows(b, std::min(x.numel(), b + kReducePiece)))) return true;
    return false;
  }
  Op op("has_nonfinite", {x});
  return LLMT_KERNEL(op, has_nonfinite)(op.in("x", x), x.numel());
}

void adamw_update(std::span<const AdamWTensor> ts, const AdamWParams& hp) {
  if (std::any_of(ts.begin(), ts.end(),
                  [](const AdamWTensor& t) { return is_16bit(t.grad.dtype); })) {
    // 16-bit gradients: one tensor at a time (the same bits), each widened on its own.
    for (const AdamWTensor& t : ts) {
      AdamWParams p = hp;
      if (!t.decay) p.weight_decay = 0.0f;
      adamw_update(t.param, t.grad, t.m, t.v, p);
    }
    return;
  }
  std::vector<Tensor> all;
  for (const AdamWTensor& t : ts) all.insert(all.end(), {t.param, t.grad, t.m, t.v});
  Op op("adamw_update", all);
  LLMT_OP_REQUIRE(op, hp.step >= 1, "step=", hp.step, " must be >= 1 (1-based)");
  std::vector<float*> param, m, v;
  std::vector<const float*> grad;
  std::vector<int64_t> numel;
  std::vector<float> weight_decay;
  for (size_t k = 0; k < ts.size(); ++k) {
    const AdamWTensor& t = ts[k];
    const std::string pk = detail::concat("param[", k, "]"), gk = detail::concat("grad[", k, "]"),
                      mk = detail::concat("m[", k, "]"), vk = detail::concat("v[", k, "]");
    op.same_shape(gk.c_str(), t.grad, pk.c_str(), t.param);
    op.same_shape(mk.c_str(), t.m, pk.c_str(), t.param);
    op.same_shape(vk.c_str(), t.v, pk.c_str(), t.param);
    param.push_back(op.f32(pk.c_str(), t.param));
    grad.push_back(op.f32(gk.c_str(), t.grad));
    m.push_back(op.f32(mk.c_str(), t.m));
    v.push_back(op.f32(vk.c_str(), t.v));
    numel.push_back(t.param.numel());
    weight_decay.push_back(t.decay ? hp.weight_decay : 0.0f);
  }
  LLMT_KERNEL(op, adamw_update_multi)
  (param.data(), grad.data(), m.data(), v.data(), numel.data(), weight_decay.data(),
   static_cast<int64_t>(ts.size()), hp.lr, hp.beta1, hp.beta2, hp.eps, hp.step, hp.grad_scale);
}

namespace {

// The pointers and sizes of a list for the multi-tensor reductions.
struct ListArgs {
  std::vector<const float*> x;
  std::vector<int64_t> numel;
};

ListArgs list_args(const Op& op, std::span<const Tensor> xs) {
  ListArgs a;
  for (size_t k = 0; k < xs.size(); ++k) {
    a.x.push_back(op.f32(("x[" + std::to_string(k) + "]").c_str(), xs[k]));
    a.numel.push_back(xs[k].numel());
  }
  return a;
}

}  // namespace

double sum_squares(std::span<const Tensor> xs) {
  if (any_16bit(xs)) {  // tensor by tensor, added in list order
    double sum = 0;
    for (const Tensor& x : xs) sum += sum_squares(x);
    return sum;
  }
  Op op("sum_squares", xs);
  const ListArgs a = list_args(op, xs);
  return LLMT_KERNEL(op, sum_squares_multi)(a.x.data(), a.numel.data(),
                                            static_cast<int64_t>(xs.size()));
}

bool has_nonfinite(std::span<const Tensor> xs) {
  if (any_16bit(xs))
    return std::any_of(xs.begin(), xs.end(), [](const Tensor& x) { return has_nonfinite(x); });
  Op op("has_nonfinite", xs);
  const ListArgs a = list_args(op, xs);
  return LLMT_KERNEL(op, has_nonfinite_multi)(a.x.data(), a.numel.data(),
                                              static_cast<int64_t>(xs.size()));
}

// ---- precision --------------------------------------------------------------------------------

void round_to(Tensor x, DType target) {
  Op op("round_to", {x});
  float* p = op.f32("x", x);
  op.moves(x, 1);  // (read and written)
  switch (target) {
    case DType::f32:
      return;
    case DType::bf16:
      return LLMT_KERNEL(op, round_to_bf16)(p, x.numel());
    case DType::f16:
      return LLMT_KERNEL(op, round_to_f16)(p, x.numel());
    case DType::i32:
    case DType::f64:
      break;
  }
  LLMT_OP_REQUIRE(op, false, "cannot round to ", dtype_name(target), " (bf16, f16 or f32 only)");
}

void convert(Tensor dst, Tensor src) {
  Op op("convert", {dst, src});
  op.same_shape("dst", dst, "src", src);
  LLMT_OP_REQUIRE(op, present(dst) && present(src), "dst and src are required");
  LLMT_OP_REQUIRE(op, dst.dtype != DType::i32 && src.dtype != DType::i32, "dst ", describe(dst),
                  ", src ", describe(src), ": only f32, bf16 and f16 convert");
  op.moves(dst, 1);
  op.moves(src, 1);
  LLMT_KERNEL(op, convert)(dst.data, dst.dtype, src.data, src.dtype, src.numel());
}

// ---- FP8 --------------------------------------------------------------------------------------

namespace {

// The (TR, TC) tile grid of an (M,K) tensor cut into tr x tc tiles.
std::array<int64_t, 2> fp8_tiles(Op& op, const Tensor& in, int64_t tr, int64_t tc) {
  LLMT_OP_REQUIRE(op, in.ndim() == 2, "in is ", describe(in), ", expected (M,K)");
  LLMT_OP_REQUIRE(op, tr >= 1 && tc >= 1, "tile ", tr, "x", tc, ": both sides must be >= 1");
  return {(in.shape[0] + tr - 1) / tr, (in.shape[1] + tc - 1) / tc};
}

}  // namespace

void fp8_amax(Tensor amax, Tensor in, int64_t tile_rows, int64_t tile_cols) {
  Op op("fp8_amax", {amax, in});
  const auto [TR, TC] = fp8_tiles(op, in, tile_rows, tile_cols);
  op.shape("amax", amax, {TR, TC});
  const float* x = op.in("in", in);
  LLMT_KERNEL(op, fp8_amax)
  (op.f32("amax", amax), x, in.shape[0], in.shape[1], tile_rows, tile_cols);
}

void fp8_quantize(Tensor out, Tensor in, Tensor amax, int64_t tile_rows, int64_t tile_cols,
                  Fp8Format fmt) {
  Op op("fp8_quantize", {out, in, amax});
  const auto [TR, TC] = fp8_tiles(op, in, tile_rows, tile_cols);
  op.same_shape("out", out, "in", in);
  op.shape("amax", amax, {TR, TC});
  LLMT_OP_REQUIRE(op, out.data == nullptr || out.data != in.data, "out may not alias in");
  const float* x = op.in("in", in);
  LLMT_KERNEL(op, fp8_quantize)
  (op.f32("out", out), x, op.f32("amax", amax), in.shape[0], in.shape[1], tile_rows, tile_cols,
   static_cast<int>(fmt));
}

// ---- integer block quantisation ---------------------------------------------------------------

int64_t int_packed_words(int64_t n, int64_t block, int bits) {
  const int64_t per = 32 / bits;  // kernel_math::int_packed_words
  return (n + block - 1) / block * (1 + (block + per - 1) / per);
}

namespace {
// (S, L) of in/out and (S, W) of packed, checked.
std::array<int64_t, 2> int_shape(Op& op, const Tensor& values, const Tensor& packed, int64_t block,
                                 int bits) {
  LLMT_OP_REQUIRE(op, block >= 1, "block ", block, ": must be >= 1");
  LLMT_OP_REQUIRE(op, bits == 8 || bits == 4, "bits ", bits, ": must be 8 or 4");
  LLMT_OP_REQUIRE(op, values.ndim() == 2, "values are ", describe(values), ", expected (S,L)");
  const int64_t S = values.shape[0], L = values.shape[1];
  op.shape("packed", packed, {S, int_packed_words(L, block, bits)});
  return {S, L};
}
}  // namespace

void quantize_int(Tensor packed, Tensor in, int64_t block, int bits) {
  Op op("quantize_int", {packed, in});
  const auto [S, L] = int_shape(op, in, packed, block, bits);
  const float* x = op.in("in", in);
  LLMT_KERNEL(op, quantize_int)(op.i32_out("packed", packed), x, S, L, block, bits);
}

void dequantize_int(Tensor out, Tensor packed, int64_t block, int bits) {
  Op op("dequantize_int", {out, packed});
  const auto [S, L] = int_shape(op, out, packed, block, bits);
  LLMT_KERNEL(op, dequantize_int)
  (op.out("out", out), op.i32("packed", packed), S, L, block, bits);
}

// ---- initialisation ---------------------------------------------------------------------------

void init_normal(Tensor x, float std, uint64_t seed, uint64_t stream, int64_t global_offset,
                 int64_t global_row_stride) {
  Op op("init_normal", {x});
  LLMT_OP_REQUIRE(op, global_offset >= 0, "global_offset=", global_offset, " must be >= 0");
  int64_t W = x.numel(), stride = W;
  if (global_row_stride > 0) {
    op.ndim("x", x, 2);
    W = x.size(1);
    stride = global_row_stride;
    LLMT_OP_REQUIRE(op, W <= stride, "x is ", describe(x),
                    ", wider than global_row_stride=", stride);
  }
  if (x.numel() == 0) return;
  LLMT_KERNEL(op, init_normal)
  (op.out("x", x), x.numel(), std, seed, stream, global_offset, W, stride);
}

Recording::Recording(OpTally& tally) : outer_(recording_tally) {
  recording_tally = &tally;
}
Recording::~Recording() {
  recording_tally = outer_;
}
bool Recording::active() {
  return recording_tally != nullptr;
}

}  // namespace llmt::ops

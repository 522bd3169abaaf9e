// Errors and checks. Every failure a user can cause names the key/file/numbers involved.
// ConfigError (usage and configuration problems) maps to exit code 2, Error to exit code 1.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace llmt {

// A runtime failure: exit code 1.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A usage or configuration error the user can fix: exit code 2.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& msg);
// Bytes read from a file that may be damaged, fit for a message: printable ASCII as it is, every
// other byte (and the backslash) as \xHH, so a message stays valid UTF-8 whatever the file held.
std::string escaped(std::string_view bytes);

}  // namespace detail

}  // namespace llmt

// LLMT_STATUS_CHECK(call, ok, message): throws llmt::Error naming the file, line, call and
// message(status) when `call` returns a status other than `ok`. The body of the GPU libraries'
// checks (LLMT_CUDA_CHECK, LLMT_CUBLAS_CHECK, LLMT_CUDNN_CHECK, the NCCL backend's), each a
// one-line definition beside its library; this header includes none of them.
#define LLMT_STATUS_CHECK(call, ok, message)                                                 \
  do {                                                                                       \
    const auto st_ = (call);                                                                 \
    if (st_ != (ok))                                                                         \
      throw ::llmt::Error(                                                                   \
          ::llmt::detail::concat(__FILE__, ":", __LINE__, ": ", #call, ": ", message(st_))); \
  } while (0)

// LLMT_CHECK(cond, "seq_len=", T, " is not divisible by ", k): throws llmt::Error with file:line.
#define LLMT_CHECK(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) [[unlikely]]                                                              \
      ::llmt::detail::check_failed(__FILE__, __LINE__, #cond,                              \
                                   ::llmt::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

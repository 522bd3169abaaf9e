// Formats a failed LLMT_CHECK into one line: file:line, the condition, the context.
#include "core/check.h"

#include <cstdio>

namespace llmt::detail {

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::string where = file;
  // Report paths relative to the source tree, not the build machine.
  for (const char* root : {"/engine/", "/kernels/", "/data/", "/checkpoints/", "/app/"}) {
    auto pos = where.rfind(root);
    if (pos != std::string::npos) {
      where = where.substr(pos + 1);
      break;
    }
  }
  throw Error(
      concat(where, ":", line, ": check failed (", cond, ")", msg.empty() ? "" : ": ", msg));
}

std::string escaped(std::string_view bytes) {
  std::string s;
  for (const char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      s += ch;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      s += buf;
    }
  }
  return s;
}

}  // namespace llmt::detail

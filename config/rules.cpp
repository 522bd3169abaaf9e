#include "config/rules.h"

namespace llmt {

void Rules::require(bool ok, const std::vector<std::string_view>& keys, const std::string& msg) {
  if (ok) return;
  std::string origin;
  for (std::string_view k : keys)
    for (const Origin& o : origins_)
      if (o.key == k) origin += detail::concat(origin.empty() ? " (" : ", ", k, " at ", o.at);
  errors.push_back(msg + (origin.empty() ? "" : origin + ")"));
}

}  // namespace llmt

// The op-case table that the GPU suite runs on CUDA (op_cases.h), checked where CI can run it:
// it names every op declared in kernels/ops.h, every case passes the dispatcher's checks and
// changes something, and running a case through a DeviceBackend's buffers gives the bits of a
// run in host memory (the round trip the GPU comparison relies on).
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "engine/core/allocator.h"
#include "tests/unit/ops/op_cases.h"

namespace llmt::test {
namespace {

// The functions declared in kernels/ops.h.
std::set<std::string> declared_ops() {
  std::ifstream in(LLMT_SOURCE_DIR "/kernels/ops.h");
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  std::set<std::string> names;
  const std::regex decl(R"(\n(void|double|bool) (\w+)\()");
  for (auto it = std::sregex_iterator(s.begin(), s.end(), decl); it != std::sregex_iterator(); ++it)
    names.insert((*it)[2]);
  return names;
}

TEST(OpCases, CoverEveryOpOfOpsH) {
  const std::set<std::string> declared = declared_ops();
  ASSERT_GT(declared.size(), 30u) << "could not read the declarations of kernels/ops.h";
  std::set<std::string> covered, names;
  for (const OpCase& c : op_cases()) {
    EXPECT_TRUE(declared.count(c.op)) << c.name << " calls " << c.op << ", not in ops.h";
    EXPECT_TRUE(names.insert(c.name).second) << "two cases named " << c.name;
    covered.insert(c.op);
  }
  for (const std::string& op : declared) EXPECT_TRUE(covered.count(op)) << op << " has no case";
}

TEST(OpCases, EveryCaseChangesSomething) {
  for (const OpCase& c : op_cases()) {
    const OpResult r = run_case(c);
    bool changed = !r.scalars.empty();
    for (size_t i = 0; i < r.args.size() && !changed; ++i)
      changed = r.args[i].defined() && !bits_equal(r.args[i], c.args[i]);
    EXPECT_TRUE(changed) << c.name << " leaves every argument as it was and returns nothing";
  }
}

TEST(OpCases, BackendBuffersGiveTheBitsOfHostMemory) {
  auto backend = make_cpu_backend();
  Allocator alloc(*backend);
  for (const OpCase& c : op_cases()) {
    for (const OpCase& v : {c, bf16_storage(c)}) {
      EXPECT_TRUE(results_close(run_case(v, &alloc), run_case(v), Tol{0.0, 0.0})) << v.name;
    }
  }
  EXPECT_EQ(alloc.stats().live_total, 0);
}

TEST(OpCases, ResultsCloseFailsOnADifference) {
  const OpCase c = op_cases().front();
  const OpResult a = run_case(c);
  OpResult b = a;
  b.args[0][3] += 1e-3f;
  EXPECT_FALSE(results_close(b, a, Tol{1e-5, 1e-6}));
  EXPECT_TRUE(results_close(b, a, Tol{0.0, 2e-3}));
}

}  // namespace
}  // namespace llmt::test

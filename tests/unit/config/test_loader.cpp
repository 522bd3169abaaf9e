// The config library on a schema of its own (config): it knows no section of llmtrain's,
// so a component with a new section ([moe] here) gets merging, --set, did-you-mean, typed reads
// and Rules with origins from it unchanged. The full parse is tested in tests/unit/train.
#include <gtest/gtest.h>

#include <algorithm>

#include "config/loader.h"

namespace llmt {
namespace {

const Schema kSchema{
    {{"moe", {{"num_experts"}, {"top_k"}, {"router", true}}}, {"log", {{"interval"}}}}};

int64_t int_of(const Setting& s) {
  int64_t v = -1;
  EXPECT_FALSE(read_value(*s.node, v));
  return v;
}

TEST(ConfigLoader, MergesFilesAndOverridesKeyByKey) {
  Loader l(kSchema);
  l.load_text("[moe]\nnum_experts = 8\ntop_k = 2\n", "a.toml");
  l.add_override("moe.top_k=1");
  l.add_override("moe.router=sinkhorn-2");  // text key: kept verbatim
  ASSERT_TRUE(l.errors.empty()) << l.errors.front();
  ASSERT_EQ(l.settings.size(), 3u);
  EXPECT_EQ(int_of(l.settings[0]), 8);
  EXPECT_EQ(int_of(l.settings[1]), 1);
  EXPECT_EQ(l.settings[1].at.str(), "--set");
  std::string router;
  EXPECT_FALSE(read_value(*l.settings[2].node, router));
  EXPECT_EQ(router, "sinkhorn-2");
  EXPECT_EQ(l.settings[0].at.str(), "a.toml:2:1");
}

// A section inside another ([model.moe] inside [model]): written as a sub-table, as a dotted
// header after its parent's keys, and as --set model.moe.key=...
TEST(ConfigLoader, NestedSectionsReadAsTheirOwn) {
  const Schema schema{{{"model", {{"n_layers"}}}, {"model.moe", {{"num_experts"}, {"top_k"}}}}};
  Loader l(schema);
  l.load_text("[model]\nn_layers = 4\n[model.moe]\nnum_experts = 8\n", "n.toml");
  l.load_text("model = { moe = { top_k = 1 } }\n", "inline.toml");
  l.add_override("model.moe.top_k=2");
  l.add_override("model.n_layers=6");
  ASSERT_TRUE(l.errors.empty()) << l.errors.front();
  auto find = [&](const std::string& dotted) -> const Setting& {
    auto it = std::find_if(l.settings.begin(), l.settings.end(),
                           [&](const Setting& s) { return s.dotted() == dotted; });
    EXPECT_NE(it, l.settings.end()) << dotted;
    return *it;
  };
  ASSERT_EQ(l.settings.size(), 3u);  // later ones replace earlier ones key by key
  EXPECT_EQ(find("model.moe.num_experts").at.str(), "n.toml:4:1");
  EXPECT_EQ(int_of(find("model.moe.num_experts")), 8);
  EXPECT_EQ(int_of(find("model.moe.top_k")), 2);  // inline.toml's 1, then --set
  EXPECT_EQ(int_of(find("model.n_layers")), 6);
  Loader bad(schema);
  bad.load_text("[model.moe]\nnum_expert = 8\n", "t.toml");
  bad.add_override("model.moe.topk=2");
  EXPECT_EQ(bad.errors,
            (std::vector<std::string>{
                "unknown key model.moe.num_expert at t.toml:2:1 — did you mean "
                "model.moe.num_experts?",
                "unknown key model.moe.topk at --set — did you mean model.moe.top_k?"}));
}

TEST(ConfigLoader, UnknownKeysAndSectionsSuggestTheNearest) {
  Loader l(kSchema);
  l.load_text("[moe]\nnum_expert = 8\n[logg]\ninterval = 1\n[log]\ntop_k = 2\n", "b.toml");
  std::vector<std::string> errors = l.errors;  // in the document's table order
  std::sort(errors.begin(), errors.end());
  EXPECT_EQ(errors, (std::vector<std::string>{
                        "unknown key log.top_k at b.toml:6:1 — did you mean moe.top_k?",
                        "unknown key moe.num_expert at b.toml:2:1 — did you mean moe.num_experts?",
                        "unknown section [logg] at b.toml:3:2 — did you mean [log]?"}));
}

TEST(ConfigLoader, TypedReadsSayWhatWasExpectedAndFound) {
  Loader l(kSchema);
  l.load_text("[moe]\nnum_experts = \"eight\"\ntop_k = 1.5\n", "c.toml");
  int64_t v = 0;
  EXPECT_EQ(read_value(*l.settings[0].node, v).value_or(""),
            "expected an integer, found a string (\"eight\")");
  EXPECT_EQ(read_value(*l.settings[1].node, v).value_or(""),
            "expected an integer, found a float (1.5)");
  constexpr std::array<std::string_view, 2> kRouters{"topk", "sinkhorn"};
  size_t i = 0;
  EXPECT_EQ(read_choice(*l.settings[0].node, kRouters, i).value_or(""),
            "expected one of \"topk\", \"sinkhorn\", found a string (\"eight\")");
}

TEST(ConfigLoader, RulesNameWhereEachKeyWasSet) {
  Loader l(kSchema);
  l.load_text("[moe]\nnum_experts = 6\ntop_k = 8\n", "d.toml");
  Rules r(l.origins());
  r.at_least<int64_t>("moe.num_experts", 6, 8);
  r.require(false, {"moe.top_k", "moe.num_experts"}, "moe.top_k=8 exceeds moe.num_experts=6");
  r.positive("log.interval", int64_t{0});
  ASSERT_EQ(r.errors.size(), 3u);
  EXPECT_EQ(r.errors[0], "moe.num_experts=6 must be >= 8 (moe.num_experts at d.toml:2:1)");
  EXPECT_EQ(r.errors[1],
            "moe.top_k=8 exceeds moe.num_experts=6 (moe.top_k at d.toml:3:1, moe.num_experts at "
            "d.toml:2:1)");
  EXPECT_EQ(r.errors[2], "log.interval=0 must be > 0");  // not set: no origin
}

TEST(ConfigLoader, TomlSyntaxAndIncludeProblemsThrow) {
  Loader l(kSchema);
  EXPECT_THROW(l.load_text("[moe\n", "e.toml"), ConfigError);
  EXPECT_THROW(l.load_file("/nonexistent/f.toml", "config file"), ConfigError);
}

}  // namespace
}  // namespace llmt

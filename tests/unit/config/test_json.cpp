// The JSON reader (config/json.h) as checkpoint import uses it: values, escapes (UTF-8 from \u
// and surrogate pairs), numbers, member order, and errors that name the line and column.
// (data prepare's JSONL use is test_prepare's.)
#include <gtest/gtest.h>

#include "config/json.h"
#include "core/check.h"

namespace llmt {
namespace {

TEST(Json, ReadsEveryKindOfValue) {
  const Json j = parse_json(
      R"({"a": 1, "b": -2.5e3, "c": "x\"\\\/\n\u00e9\ud83d\ude00", "d": [true, false, null],
          "e": {"f": []}, "g": 9007199254740992})",
      "test");
  ASSERT_EQ(j.kind, Json::Kind::object);
  ASSERT_EQ(j.members.size(), 6u);
  EXPECT_EQ(j.members[0].first, "a");  // file order
  EXPECT_EQ(j.find("a")->number, 1);
  EXPECT_EQ(j.find("b")->number, -2500);
  EXPECT_EQ(j.find("c")->string, "x\"\\/\n\xc3\xa9\xf0\x9f\x98\x80");
  ASSERT_EQ(j.find("d")->items.size(), 3u);
  EXPECT_TRUE(j.find("d")->items[0].boolean);
  EXPECT_TRUE(j.find("d")->items[2].is_null());
  EXPECT_EQ(j.find("e")->find("f")->kind, Json::Kind::array);
  EXPECT_EQ(j.find("g")->number, 9007199254740992.0);
  EXPECT_EQ(j.find("missing"), nullptr);
}

TEST(Json, ErrorsNameLineAndColumn) {
  for (const auto& [text, want] : std::vector<std::pair<const char*, const char*>>{
           {R"({"a": 1,})", "config.json: col 9: expected '\"', found '}'"},
           {R"({"a" 1})", "config.json: col 6: expected ':', found '1'"},
           {R"(["x)", "config.json: col 4: unterminated string"},
           {R"({"a": NaN})", "config.json: col 7: not a JSON value: 'NaN'"},
           {R"({"a": 0x10})", "config.json: col 7: not a JSON number: '0x10'"},
           {R"([1] 2)", "config.json: col 5: text after the JSON value"},
           {"{\n  \"a\": tru\n}", "config.json: line 2 col 8: not a JSON value: 'tru'"}}) {
    try {
      parse_json(text, "config.json");
      ADD_FAILURE() << text << " parsed";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), want) << text;
    }
  }
}

TEST(Json, NestingIsBounded) {
  EXPECT_THROW(parse_json(std::string(100, '[') + std::string(100, ']'), "deep"), Error);
  EXPECT_NO_THROW(parse_json(std::string(50, '[') + std::string(50, ']'), "ok"));
}

}  // namespace
}  // namespace llmt

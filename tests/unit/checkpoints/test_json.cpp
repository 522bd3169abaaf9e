// The JSON reader behind checkpoint import: values, escapes (UTF-8 from \u and surrogate pairs),
// numbers, member order, and errors that name the byte offset.
#include <gtest/gtest.h>

#include "checkpoints/json.h"
#include "core/check.h"

namespace llmt::ckpt {
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

TEST(Json, ErrorsNameTheOffset) {
  for (const auto& [text, offset] :
       std::vector<std::pair<const char*, const char*>>{{R"({"a": 1,})", "byte 8"},
                                                        {R"({"a" 1})", "byte 5"},
                                                        {R"(["x)", "byte 3"},
                                                        {R"({"a": NaN})", "byte 6"},
                                                        {R"([1] 2)", "byte 4"},
                                                        {R"("\q")", "byte 3"}}) {
    try {
      parse_json(text, "config.json");
      ADD_FAILURE() << text << " parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("config.json: invalid JSON at " + std::string(offset)),
                std::string::npos)
          << text << ": " << e.what();
    }
  }
}

TEST(Json, NestingIsBounded) {
  EXPECT_THROW(parse_json(std::string(100, '[') + std::string(100, ']'), "deep"), Error);
  EXPECT_NO_THROW(parse_json(std::string(50, '[') + std::string(50, ']'), "ok"));
}

}  // namespace
}  // namespace llmt::ckpt

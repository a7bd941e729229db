#include "runtime/stop_strings.h"

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace colibri {
namespace {

struct Outcome {
  std::string shown;  // everything emitted, plus flush() if not stopped
  bool stopped = false;
  std::string matched;
  bool operator==(const Outcome&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  return os << "{shown='" << o.shown << "' stopped=" << o.stopped << " matched='" << o.matched << "'}";
}

Outcome run(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopStringMatcher matcher(stops);
  Outcome out;
  for (const auto& piece : pieces) {
    auto step = matcher.push(piece);
    out.shown += step.emit;
    if (step.stopped) {
      out.stopped = true;
      break;
    }
  }
  if (!out.stopped) out.shown += matcher.flush();
  out.matched = std::string(matcher.matched());
  return out;
}

TEST(StopStrings, StopAcrossPieceBoundary) {
  StopStringMatcher matcher({"llo"});
  auto step = matcher.push("Hel");
  EXPECT_EQ(step.emit, "He");  // "l" might start "llo"
  EXPECT_FALSE(step.stopped);
  step = matcher.push("lo");
  EXPECT_EQ(step.emit, "");
  EXPECT_TRUE(step.stopped);
  EXPECT_EQ(matcher.matched(), "llo");
  EXPECT_EQ(matcher.flush(), "");
}

TEST(StopStrings, StopInsideOnePieceEmitsTextBefore) {
  StopStringMatcher matcher({"</s>"});
  auto step = matcher.push("answer</s>trailing");
  EXPECT_EQ(step.emit, "answer");
  EXPECT_TRUE(step.stopped);
}

TEST(StopStrings, PartialThatIsNotAStopIsEmitted) {
  StopStringMatcher matcher({"llo"});
  EXPECT_EQ(matcher.push("Hel").emit, "He");
  auto step = matcher.push("p");
  EXPECT_EQ(step.emit, "lp");
  EXPECT_FALSE(step.stopped);

  StopStringMatcher longer({"<|end|>"});
  EXPECT_EQ(longer.push("a<|en").emit, "a");
  EXPECT_EQ(longer.push("d|").emit, "");
  step = longer.push("x");
  EXPECT_EQ(step.emit, "<|end|x");
  EXPECT_FALSE(step.stopped);
  EXPECT_EQ(longer.matched(), "");
}

TEST(StopStrings, SelfOverlappingPrefix) {
  // "aa" is held; the stop "aab" starts at the second 'a'.
  StopStringMatcher matcher({"aab"});
  EXPECT_EQ(matcher.push("aa").emit, "");
  auto step = matcher.push("ab");
  EXPECT_EQ(step.emit, "a");
  EXPECT_TRUE(step.stopped);
}

TEST(StopStrings, MultipleStops) {
  EXPECT_EQ(run({"\n\n", "User:"}, {"Hi\n", "User", ": x"}), (Outcome{"Hi\n", true, "User:"}));
  EXPECT_EQ(run({"\n\n", "User:"}, {"Hi\n", "\nUser:"}), (Outcome{"Hi", true, "\n\n"}));
  EXPECT_EQ(run({"\n\n", "User:"}, {"Hi\nUse", "d it"}), (Outcome{"Hi\nUsed it", false, ""}));
}

TEST(StopStrings, FirstStopToCompleteWins) {
  // "bc" completes before "abcd" does.
  EXPECT_EQ(run({"abcd", "bc"}, {"xabcd"}), (Outcome{"xa", true, "bc"}));
  // Same end: the one that started first (the longer) wins.
  EXPECT_EQ(run({"cd", "bcd"}, {"abcd"}), (Outcome{"a", true, "bcd"}));
}

TEST(StopStrings, StopAtTheVeryBeginning) {
  EXPECT_EQ(run({"STOP"}, {"STOP and more"}), (Outcome{"", true, "STOP"}));
  EXPECT_EQ(run({"STOP"}, {"ST", "OP"}), (Outcome{"", true, "STOP"}));
  EXPECT_EQ(run({"STOP"}, {"STOP"}), (Outcome{"", true, "STOP"}));
}

TEST(StopStrings, Utf8MultiByteStops) {
  // "。" is E3 80 82; byte-level tokens can split it.
  StopStringMatcher matcher({"。"});
  auto step = matcher.push("答え\xE3\x80");
  EXPECT_EQ(step.emit, "答え");
  EXPECT_FALSE(step.stopped);
  step = matcher.push("\x82続き");
  EXPECT_EQ(step.emit, "");
  EXPECT_TRUE(step.stopped);

  // A 4-byte emoji stop fed one byte at a time.
  const std::string wave = "👋";
  ASSERT_EQ(wave.size(), 4u);
  std::vector<std::string> bytes{"hé "};
  for (char c : wave) bytes.push_back(std::string(1, c));
  bytes.push_back("après");
  EXPECT_EQ(run({wave}, bytes), (Outcome{"hé ", true, wave}));

  // Shares a lead byte with the stop but is a different character.
  EXPECT_EQ(run({"ñ"}, {"a\xC3", "\xA9"}), (Outcome{"aé", false, ""}));
  EXPECT_EQ(run({"ñ"}, {"a\xC3", "\xB1z"}), (Outcome{"a", true, "ñ"}));
}

TEST(StopStrings, HoldsBackAnUnfinishedUtf8Character) {
  StopStringMatcher matcher({});
  EXPECT_EQ(matcher.push("caf\xC3").emit, "caf");
  EXPECT_EQ(matcher.push("\xA9!").emit, "é!");
  EXPECT_EQ(matcher.push("\xF0\x9F").emit, "");
  EXPECT_EQ(matcher.push("\x91").emit, "");
  EXPECT_EQ(matcher.push("\x8B").emit, "👋");
  // An invalid tail is not held forever: it goes out with the next piece.
  EXPECT_EQ(matcher.push("\xC3").emit, "");
  EXPECT_EQ(matcher.push("x").emit, "\xC3x");
  EXPECT_EQ(matcher.push("\x80").emit, "\x80");  // stray continuation byte
}

TEST(StopStrings, Flush) {
  StopStringMatcher matcher({"</answer>"});
  EXPECT_EQ(matcher.push("42 </ans").emit, "42 ");
  EXPECT_EQ(matcher.flush(), "</ans");
  EXPECT_EQ(matcher.flush(), "");

  StopStringMatcher utf8({"x"});
  EXPECT_EQ(utf8.push("a\xE2\x82").emit, "a");
  EXPECT_EQ(utf8.flush(), "\xE2\x82");  // end of generation: hand out whatever is left
}

TEST(StopStrings, AfterStopEverythingIsDropped) {
  StopStringMatcher matcher({"END"});
  EXPECT_TRUE(matcher.push("abcEND").stopped);
  auto step = matcher.push("more text");
  EXPECT_TRUE(step.stopped);
  EXPECT_EQ(step.emit, "");
  EXPECT_EQ(matcher.flush(), "");
  EXPECT_TRUE(matcher.stopped());
}

TEST(StopStrings, NoStopsOrEmptyStopsPassThrough) {
  EXPECT_EQ(run({}, {"a", "b", "c"}), (Outcome{"abc", false, ""}));
  StopStringMatcher matcher({"", ""});
  auto step = matcher.push("hello");
  EXPECT_EQ(step.emit, "hello");
  EXPECT_FALSE(step.stopped);
  EXPECT_EQ(run({"", "lo"}, {"hel", "lo"}), (Outcome{"hel", true, "lo"}));
}

TEST(StopStrings, ResultDoesNotDependOnHowTextIsSplit) {
  struct Case {
    std::vector<std::string> stops;
    std::string text;
  };
  const std::vector<Case> cases{
      {{"llo"}, "Hello, hello world"},
      {{"abcd", "bc"}, "xxabcdyy"},
      {{"cd", "bcd"}, "abcde"},
      {{"<|im_end|>", "\n\nUser"}, "ok <|im_en <|im_end|> tail"},
      {{"aab"}, "aaaaab"},
      {{"。", "👋"}, "日本語👋です。"},
      {{"zzz"}, "no stop here at all"},
      {{"ab", "b"}, "cab"},
  };
  for (const auto& c : cases) {
    const Outcome whole = run(c.stops, {c.text});
    std::vector<std::string> bytes;
    for (char ch : c.text) bytes.push_back(std::string(1, ch));
    EXPECT_EQ(run(c.stops, bytes), whole) << c.text;
    for (std::size_t i = 0; i <= c.text.size(); ++i) {
      for (std::size_t j = i; j <= c.text.size(); j += 3) {
        const std::vector<std::string> pieces{c.text.substr(0, i), c.text.substr(i, j - i), c.text.substr(j)};
        ASSERT_EQ(run(c.stops, pieces), whole) << c.text << " split at " << i << "," << j;
      }
    }
  }
}

TEST(StopStrings, EmittedTextNeverContainsStopPrefixThatLaterCompletes) {
  // Feeding byte by byte, nothing from the stop string may leak out before the stop.
  StopStringMatcher matcher({"<stop>"});
  std::string shown;
  const std::string text = "a<st<sto<stop>b";
  bool stopped = false;
  for (char ch : text) {
    auto step = matcher.push(std::string_view(&ch, 1));
    shown += step.emit;
    if (step.stopped) {
      stopped = true;
      break;
    }
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(shown, "a<st<sto");
}

}  // namespace
}  // namespace colibri

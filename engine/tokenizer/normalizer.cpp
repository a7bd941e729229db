// Normalizers of tokenizer.json (tokenizers/src/normalizers).
#include <nlohmann/json.hpp>

#include <utility>

#include "tokenizer/json_util.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/unicode.h"

namespace colibri::tokenizer_detail {

namespace {

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  Status normalize(std::string& text) const override {
    for (const auto& step : steps_) COLIBRI_TRY(step->normalize(text));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class UnicodeFormNormalizer final : public Normalizer {
 public:
  explicit UnicodeFormNormalizer(bool compose) : compose_(compose) {}
  Status normalize(std::string& text) const override {
    text = compose_ ? nfc(text) : nfd(text);
    return Status::Ok();
  }

 private:
  bool compose_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  Status normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
    return Status::Ok();
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  Status normalize(std::string& text) const override {
    std::vector<Span> matches;
    COLIBRI_TRY(pattern_.find_all(text, matches));
    if (matches.empty()) return Status::Ok();
    std::string out;
    out.reserve(text.size() + matches.size() * content_.size());
    std::size_t prev = 0;
    for (const Span& m : matches) {
      out.append(text, prev, m.start - prev);
      out.append(content_);
      prev = m.end;
    }
    out.append(text, prev, std::string::npos);
    text = std::move(out);
    return Status::Ok();
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status normalize(std::string& text) const override {
    std::size_t begin = 0;
    std::size_t end = text.size();
    if (left_) {
      while (begin < end) {
        std::size_t pos = begin;
        if (!is_white_space(next_code_point(text, pos))) break;
        begin = pos;
      }
    }
    if (right_) {
      while (end > begin) {
        std::size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        std::size_t pos = start;
        if (!is_white_space(next_code_point(text, pos))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
    return Status::Ok();
  }

 private:
  bool left_;
  bool right_;
};

// Newer `tokenizers` ByteLevel normalizer: every byte becomes its byte-level character.
class ByteLevelNormalizer final : public Normalizer {
 public:
  Status normalize(std::string& text) const override {
    const auto& table = bytes_to_unicode();
    std::string out;
    out.reserve(text.size() * 2);
    for (char c : text) append_utf8(out, table[static_cast<unsigned char>(c)]);
    text = std::move(out);
    return Status::Ok();
  }
};

}  // namespace

Result<std::unique_ptr<Normalizer>> make_normalizer(const Json& config, std::string_view where) {
  if (!config.is_object()) return make_error("{}: must be an object or null", where);
  auto type = read_string(config, "type", where);
  if (!type.ok()) return type.error();
  const std::string& t = *type;
  if (t == "Sequence") {
    const Json* list = member(config, "normalizers");
    if (list == nullptr || !list->is_array()) return make_error("{}: 'normalizers' must be an array", where);
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (std::size_t i = 0; i < list->size(); ++i) {
      auto step = make_normalizer((*list)[i], fmt::format("{}.normalizers[{}]", where, i));
      if (!step.ok()) return step.error();
      steps.push_back(std::move(*step));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  if (t == "NFC" || t == "NFD") return std::unique_ptr<Normalizer>(new UnicodeFormNormalizer(t == "NFC"));
  if (t == "Prepend") {
    auto prefix = read_string(config, "prepend", where);
    if (!prefix.ok()) return prefix.error();
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(*prefix)));
  }
  if (t == "Replace") {
    auto pattern = read_pattern(config, "pattern", where);
    if (!pattern.ok()) return pattern.error();
    auto content = read_string(config, "content", where);
    if (!content.ok()) return content.error();
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(*pattern), std::move(*content)));
  }
  if (t == "Strip") {
    auto left = read_bool(config, "strip_left", true, where);
    if (!left.ok()) return left.error();
    auto right = read_bool(config, "strip_right", true, where);
    if (!right.ok()) return right.error();
    return std::unique_ptr<Normalizer>(new StripNormalizer(*left, *right));
  }
  if (t == "ByteLevel") return std::unique_ptr<Normalizer>(new ByteLevelNormalizer());
  return make_error("{}: unsupported normalizer type '{}' (supported: Sequence, NFC, NFD, Prepend, Replace, "
                    "Strip, ByteLevel)",
                    where, t);
}

}  // namespace colibri::tokenizer_detail

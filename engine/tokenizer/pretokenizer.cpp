// Pre-tokenizers of tokenizer.json (tokenizers/src/pre_tokenizers).
#include <nlohmann/json.hpp>

#include <optional>
#include <utility>

#include "tokenizer/json_util.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/unicode.h"

namespace colibri::tokenizer_detail {

namespace {

// The GPT-2 pattern that ByteLevel uses when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Splits every piece with `pattern`/`behavior` (HF PreTokenizedString::split followed
// by NormalizedString::split), dropping empty results.
Status split_pieces(std::vector<PreToken>& pieces, const Pattern& pattern, SplitBehavior behavior,
                    bool invert) {
  std::vector<PreToken> out;
  out.reserve(pieces.size());
  std::vector<Span> spans;
  for (PreToken& piece : pieces) {
    spans.clear();
    COLIBRI_TRY(split_text(piece.text, pattern, behavior, invert, spans));
    for (const Span& s : spans) {
      if (s.end == s.start) continue;
      out.push_back({piece.text.substr(s.start, s.end - s.start), piece.at_origin && s.start == 0});
    }
  }
  pieces = std::move(out);
  return Status::Ok();
}

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  Status pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (const auto& step : steps_) COLIBRI_TRY(step->pre_tokenize(pieces));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  Status pre_tokenize(std::vector<PreToken>& pieces) const override {
    return split_pieces(pieces, pattern_, behavior_, invert_);
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::optional<Pattern> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  Status pre_tokenize(std::vector<PreToken>& pieces) const override {
    if (add_prefix_space_) {
      for (PreToken& piece : pieces) {
        if (piece.text.empty() || piece.text[0] != ' ') piece.text.insert(piece.text.begin(), ' ');
      }
    }
    if (regex_) COLIBRI_TRY(split_pieces(pieces, *regex_, SplitBehavior::kIsolated, false));
    const auto& table = bytes_to_unicode();
    std::string mapped;
    for (PreToken& piece : pieces) {
      mapped.clear();
      for (char c : piece.text) append_utf8(mapped, table[static_cast<unsigned char>(c)]);
      piece.text.swap(mapped);
    }
    return Status::Ok();
  }

 private:
  bool add_prefix_space_;
  std::optional<Pattern> regex_;
};

enum class PrependScheme { kAlways, kNever, kFirst };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split)
      : scheme_(scheme), split_(split) {
    append_utf8(replacement_, replacement);
  }
  Status pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (PreToken& piece : pieces) {
      std::string replaced;
      replaced.reserve(piece.text.size() + replacement_.size());
      for (char c : piece.text) {
        if (c == ' ') {
          replaced.append(replacement_);
        } else {
          replaced.push_back(c);
        }
      }
      const bool starts = replaced.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && piece.at_origin))) {
        replaced.insert(0, replacement_);
      }
      piece.text = std::move(replaced);
    }
    if (!split_) return Status::Ok();
    return split_pieces(pieces, Pattern::literal(replacement_), SplitBehavior::kMergedWithNext, false);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

Result<SplitBehavior> read_behavior(const Json& config, std::string_view where, SplitBehavior fallback) {
  const Json* value = member(config, "behavior");
  if (value == nullptr) return fallback;
  const std::string name = value->is_string() ? value->get<std::string>() : std::string();
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return make_error("{}: unknown split behavior {}", where, value->dump());
}

Result<std::unique_ptr<PreTokenizer>> regex_split(std::string_view pattern, SplitBehavior behavior, bool invert,
                                                  std::string_view where) {
  auto regex = Regex::compile(pattern, where);
  if (!regex.ok()) return regex.error();
  return std::unique_ptr<PreTokenizer>(
      new SplitPreTokenizer(Pattern::regex(std::move(*regex)), behavior, invert));
}

}  // namespace

Result<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const Json& config, std::string_view where) {
  if (!config.is_object()) return make_error("{}: must be an object or null", where);
  auto type = read_string(config, "type", where);
  if (!type.ok()) return type.error();
  const std::string& t = *type;
  if (t == "Sequence") {
    const Json* list = member(config, "pretokenizers");
    if (list == nullptr || !list->is_array()) return make_error("{}: 'pretokenizers' must be an array", where);
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (std::size_t i = 0; i < list->size(); ++i) {
      auto step = make_pre_tokenizer((*list)[i], fmt::format("{}.pretokenizers[{}]", where, i));
      if (!step.ok()) return step.error();
      steps.push_back(std::move(*step));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(steps)));
  }
  if (t == "Split") {
    auto pattern = read_pattern(config, "pattern", where);
    if (!pattern.ok()) return pattern.error();
    auto behavior = read_behavior(config, where, SplitBehavior::kIsolated);
    if (!behavior.ok()) return behavior.error();
    auto invert = read_bool(config, "invert", false, where);
    if (!invert.ok()) return invert.error();
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(*pattern), *behavior, *invert));
  }
  if (t == "ByteLevel") {
    auto add_prefix_space = read_bool(config, "add_prefix_space", true, where);
    if (!add_prefix_space.ok()) return add_prefix_space.error();
    auto use_regex = read_bool(config, "use_regex", true, where);
    if (!use_regex.ok()) return use_regex.error();
    std::optional<Pattern> regex;
    if (*use_regex) {
      auto compiled = Regex::compile(kGpt2Pattern, fmt::format("{} (GPT-2 regex)", where));
      if (!compiled.ok()) return compiled.error();
      regex = Pattern::regex(std::move(*compiled));
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(*add_prefix_space, std::move(regex)));
  }
  if (t == "Metaspace") {
    auto replacement = read_char(config, "replacement", U'\u2581', where);
    if (!replacement.ok()) return replacement.error();
    PrependScheme scheme = PrependScheme::kAlways;
    if (const Json* s = member(config, "prepend_scheme"); s != nullptr) {
      const std::string name = s->is_string() ? s->get<std::string>() : std::string();
      if (name == "always") {
        scheme = PrependScheme::kAlways;
      } else if (name == "never") {
        scheme = PrependScheme::kNever;
      } else if (name == "first") {
        scheme = PrependScheme::kFirst;
      } else {
        return make_error("{}: unknown prepend_scheme {}", where, s->dump());
      }
    } else {
      auto add_prefix_space = read_bool(config, "add_prefix_space", true, where);
      if (!add_prefix_space.ok()) return add_prefix_space.error();
      scheme = *add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
    }
    auto split = read_bool(config, "split", true, where);
    if (!split.ok()) return split.error();
    return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(*replacement, scheme, *split));
  }
  if (t == "Digits") {
    auto individual = read_bool(config, "individual_digits", false, where);
    if (!individual.ok()) return individual.error();
    // Rust's char::is_numeric: general categories Nd, Nl, No; one match per character.
    return regex_split("\\p{N}", *individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false,
                       where);
  }
  if (t == "Whitespace") return regex_split("\\w+|[^\\w\\s]+", SplitBehavior::kRemoved, true, where);
  if (t == "WhitespaceSplit") {
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(Pattern::code_points(&is_white_space), SplitBehavior::kRemoved, false));
  }
  if (t == "Punctuation") {
    auto behavior = read_behavior(config, where, SplitBehavior::kIsolated);
    if (!behavior.ok()) return behavior.error();
    return regex_split("[\\p{P}\\x{21}-\\x{2F}\\x{3A}-\\x{40}\\x{5B}-\\x{60}\\x{7B}-\\x{7E}]", *behavior, false,
                       where);
  }
  return make_error("{}: unsupported pre_tokenizer type '{}' (supported: Sequence, Split, ByteLevel, Metaspace, "
                    "Digits, Whitespace, WhitespaceSplit, Punctuation)",
                    where, t);
}

}  // namespace colibri::tokenizer_detail

// Decoders of tokenizer.json (tokenizers/src/decoders), each in two modes: kExact
// reproduces `tokenizers` decode() on a whole sequence; kRaw maps one token to its raw
// bytes (used by token_bytes() and the streaming decoder).
#include <nlohmann/json.hpp>

#include <utility>

#include "tokenizer/json_util.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/unicode.h"

namespace colibri::tokenizer_detail {

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "<0xNN>" -> NN, as the Rust ByteFallback decoder parses it (u8::from_str_radix also
// takes a leading '+').
int byte_token_value(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  const int hi = token[3] == '+' ? 0 : hex_digit(token[3]);
  const int lo = hex_digit(token[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    for (const auto& step : steps_) step->decode_chain(tokens, state);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    std::string bytes;
    std::string mapped;
    for (const std::string& token : tokens) {
      mapped.clear();
      bool all_mapped = find_invalid_utf8(token) == std::string::npos;
      std::size_t pos = 0;
      while (all_mapped && pos < token.size()) {
        const int b = unicode_to_byte(next_code_point(token, pos));
        if (b < 0) {
          all_mapped = false;
        } else {
          mapped.push_back(static_cast<char>(b));
        }
      }
      bytes += all_mapped ? mapped : token;
    }
    tokens.assign(1, state.mode == DecodeMode::kExact ? utf8_lossy(bytes) : bytes);
    state.fused = true;
  }
};

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&]() {
      if (pending.empty()) return;
      if (state.mode == DecodeMode::kRaw || find_invalid_utf8(pending) == std::string::npos) {
        out.push_back(pending);
      } else {
        for (std::size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (std::string& token : tokens) {
      const int byte = byte_token_value(token);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    std::string joined;
    for (const std::string& t : tokens) joined += t;
    tokens.assign(1, std::move(joined));
    state.fused = true;
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeState&) const override {
    std::vector<Span> matches;
    for (std::string& token : tokens) {
      // Raw-mode tokens may hold partial UTF-8, which a regex must not see.
      if (find_invalid_utf8(token) != std::string::npos) continue;
      matches.clear();
      if (!pattern_.find_all(token, matches).ok() || matches.empty()) continue;
      std::string out;
      std::size_t prev = 0;
      for (const Span& m : matches) {
        out.append(token, prev, m.start - prev);
        out.append(content_);
        prev = m.end;
      }
      out.append(token, prev, std::string::npos);
      token = std::move(out);
    }
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, std::size_t start, std::size_t stop) : start_(start), stop_(stop) {
    append_utf8(content_, content);
  }
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    const bool raw = state.mode == DecodeMode::kRaw;
    const bool strip_start = !raw || !state.fused || state.first;
    const bool strip_stop = !raw || !state.fused;  // the end of a stream is not known
    const std::size_t n = content_.size();
    for (std::string& token : tokens) {
      std::size_t begin = 0;
      std::size_t end = token.size();
      for (std::size_t i = 0; strip_start && i < start_; ++i) {
        if (token.compare(begin, n, content_) != 0) break;
        begin += n;
      }
      for (std::size_t i = 0; strip_stop && i < stop_; ++i) {
        if (end < begin + n || token.compare(end - n, n, content_) != 0) break;
        end -= n;
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  std::size_t start_;
  std::size_t stop_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, bool strip_first) : strip_first_(strip_first) {
    append_utf8(replacement_, replacement);
  }
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const bool index0 = state.mode == DecodeMode::kExact ? i == 0 : (state.first || state.fused);
      const bool drop = index0 && strip_first_;
      std::string& token = tokens[i];
      std::string out;
      out.reserve(token.size());
      std::size_t pos = 0;
      while (pos < token.size()) {
        if (token.compare(pos, replacement_.size(), replacement_) == 0) {
          if (!drop) out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(token[pos++]);
        }
      }
      token = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

}  // namespace

Result<std::unique_ptr<Decoder>> make_decoder(const Json& config, std::string_view where) {
  if (!config.is_object()) return make_error("{}: must be an object or null", where);
  auto type = read_string(config, "type", where);
  if (!type.ok()) return type.error();
  const std::string& t = *type;
  if (t == "Sequence") {
    const Json* list = member(config, "decoders");
    if (list == nullptr || !list->is_array()) return make_error("{}: 'decoders' must be an array", where);
    std::vector<std::unique_ptr<Decoder>> steps;
    for (std::size_t i = 0; i < list->size(); ++i) {
      auto step = make_decoder((*list)[i], fmt::format("{}.decoders[{}]", where, i));
      if (!step.ok()) return step.error();
      steps.push_back(std::move(*step));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(steps)));
  }
  if (t == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (t == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (t == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (t == "Replace") {
    auto pattern = read_pattern(config, "pattern", where);
    if (!pattern.ok()) return pattern.error();
    auto content = read_string(config, "content", where);
    if (!content.ok()) return content.error();
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(*pattern), std::move(*content)));
  }
  if (t == "Strip") {
    auto content = read_char(config, "content", std::nullopt, where);
    if (!content.ok()) return content.error();
    auto start = read_int(config, "start", 0, where);
    if (!start.ok()) return start.error();
    auto stop = read_int(config, "stop", 0, where);
    if (!stop.ok()) return stop.error();
    if (*start < 0 || *stop < 0) return make_error("{}: 'start' and 'stop' must not be negative", where);
    return std::unique_ptr<Decoder>(
        new StripDecoder(*content, static_cast<std::size_t>(*start), static_cast<std::size_t>(*stop)));
  }
  if (t == "Metaspace") {
    auto replacement = read_char(config, "replacement", U'\u2581', where);
    if (!replacement.ok()) return replacement.error();
    bool strip_first = true;
    if (const Json* s = member(config, "prepend_scheme"); s != nullptr) {
      strip_first = !(s->is_string() && s->get<std::string>() == "never");
    } else {
      auto add_prefix_space = read_bool(config, "add_prefix_space", true, where);
      if (!add_prefix_space.ok()) return add_prefix_space.error();
      strip_first = *add_prefix_space;
    }
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(*replacement, strip_first));
  }
  return make_error("{}: unsupported decoder type '{}' (supported: Sequence, ByteLevel, ByteFallback, Fuse, "
                    "Replace, Strip, Metaspace)",
                    where, t);
}

}  // namespace colibri::tokenizer_detail

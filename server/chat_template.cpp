#include "chat_template.h"

#include <fmt/format.h>

namespace colibri::server {

namespace {

// Collects a rendered conversation as runs of text and control-token ids; text
// runs are tokenized with special tokens off. The first tokenizer error is
// kept and reported by finish().
class Pieces {
 public:
  explicit Pieces(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  void text(std::string_view text) { pending_ += text; }
  void id(std::int32_t id) {
    flush();
    ids_.push_back(id);
  }
  // A template's marker, as Hugging Face tokenizes the rendered template: a
  // special token where the vocabulary has one of that text, else plain text
  // (then one run with the content around it).
  void marker(std::string_view text) {
    if (auto special = tokenizer_.token_to_id(text); special && tokenizer_.is_special(*special)) id(*special);
    else this->text(text);
  }
  Expected<std::vector<std::int32_t>> finish() {
    flush();
    if (!error_.empty())
      return ApiError::invalid(fmt::format("cannot tokenize the messages: {}", error_), "messages");
    return std::move(ids_);
  }

 private:
  void flush() {
    if (pending_.empty() || !error_.empty()) return;
    EncodeOptions options;
    options.add_special_tokens = false;
    options.parse_special = false;
    auto ids = tokenizer_.encode(pending_, options);
    if (!ids) {
      error_ = ids.error().message;
      return;
    }
    ids_.insert(ids_.end(), ids->begin(), ids->end());
    pending_.clear();
  }

  const Tokenizer& tokenizer_;
  std::string pending_;
  std::vector<std::int32_t> ids_;
  std::string error_;
};

bool known_role(const std::string& role) { return role == "system" || role == "user" || role == "assistant"; }

// The literal system turn a ChatML template writes itself, as Qwen1.5's and
// Qwen2's do when the first message is not a system one:
//   {{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}
// Its text, or empty when the template has no such literal (a template that
// renders message['content'] there has '+' or a quote before <|im_end|>).
std::string literal_system_turn(std::string_view tmpl) {
  // The opening as the template's Jinja string literal spells it ("\\n"), or
  // with a real newline.
  constexpr std::string_view kOpenings[] = {"<|im_start|>system\\n", "<|im_start|>system\n"};
  for (const std::string_view opening : kOpenings) {
    for (std::size_t at = tmpl.find(opening); at != std::string_view::npos; at = tmpl.find(opening, at + 1)) {
      const std::size_t from = at + opening.size();
      const std::size_t end = tmpl.find("<|im_end|>", from);
      if (end == std::string_view::npos) break;
      const std::string_view text = tmpl.substr(from, end - from);
      if (!text.empty() && text.find_first_of("'\"+{}\\") == std::string_view::npos) return std::string(text);
    }
  }
  return {};
}

std::string_view strip_newlines(std::string_view text, bool front, bool back) {
  while (front && !text.empty() && text.front() == '\n') text.remove_prefix(1);
  while (back && !text.empty() && text.back() == '\n') text.remove_suffix(1);
  return text;
}

}  // namespace

// Qwen3's template on an assistant message: the content after the last
// </think> (leading newlines dropped) and the reasoning before the first one
// (after its last <think>). Turns before the last user message keep the
// content only; a later turn, the last or one with reasoning, gets
// "<think>\n" + reasoning + "\n</think>\n\n" + content.
std::string ChatTemplate::assistant_turn(std::string_view text, bool after_last_query, bool last) {
  std::string_view content = text, reasoning;
  if (const std::size_t end = text.rfind("</think>"); end != std::string_view::npos) {
    content = strip_newlines(text.substr(end + 8), true, false);
    std::string_view before = strip_newlines(text.substr(0, text.find("</think>")), false, true);
    if (const std::size_t open = before.rfind("<think>"); open != std::string_view::npos)
      before = before.substr(open + 7);
    reasoning = strip_newlines(before, true, false);
  }
  if (after_last_query && (last || !reasoning.empty()))
    return fmt::format("<think>\n{}\n</think>\n\n{}", strip_newlines(reasoning, false, true),
                       strip_newlines(content, true, false));  // also when there was no </think>
  return std::string(content);
}

Result<ChatTemplate> ChatTemplate::select(const Model& model, std::string_view choice) {
  ChatTemplate t;
  const Tokenizer& tokenizer = model.tokenizer();
  t.tokenizer_ = tokenizer;
  auto im_start = tokenizer.token_to_id("<|im_start|>");
  auto im_end = tokenizer.token_to_id("<|im_end|>");
  auto bos = tokenizer.bos_id() ? tokenizer.bos_id() : model.config().bos_token_id;
  auto eos = tokenizer.eos_id() ? tokenizer.eos_id() : model.config().eos_token_id();
  const bool has_chatml = im_start && im_end;
  const std::string& text = tokenizer.chat_template();
  const std::string_view model_type = model.config().arch ? model.config().arch->model_type : "";

  auto use_chatml = [&](std::string reason) -> Result<ChatTemplate> {
    if (!has_chatml)
      return make_error("chat_template: ChatML needs <|im_start|> and <|im_end|> in the vocabulary; "
                        "this tokenizer has {}",
                        im_start ? "no <|im_end|>" : "no <|im_start|>");
    t.format_ = ChatFormat::ChatML;
    t.im_start_ = *im_start;
    t.im_end_ = *im_end;
    t.end_of_turn_ = {*im_end};
    t.default_system_ = literal_system_turn(text);
    t.strips_reasoning_ = text.find("</think>") != std::string::npos;
    t.reason_ = std::move(reason);
    if (!t.default_system_.empty())
      t.reason_ += fmt::format("; a conversation without a system message gets the template's \"{}\"",
                               t.default_system_);
    if (t.strips_reasoning_) t.reason_ += "; earlier assistant turns lose their <think> reasoning, as Qwen3's template does";
    return t;
  };
  auto use_tulu = [&](std::string reason) -> Result<ChatTemplate> {
    // The template's {{ bos_token }} and eos_token are tokenizer_config.json's.
    const auto tulu_eos = tokenizer.eos_id();
    if (!tulu_eos) return make_error("chat_template: the Tulu template needs an eos_token in tokenizer_config.json");
    t.format_ = ChatFormat::Tulu;
    t.bos_ = tokenizer.bos_id().value_or(-1);
    t.eos_ = *tulu_eos;
    t.end_of_turn_ = {*tulu_eos};
    t.reason_ = std::move(reason);
    return t;
  };
  auto use_mistral = [&](std::string reason) -> Result<ChatTemplate> {
    if (!bos || !eos) return make_error("chat_template: the Mistral template needs BOS and EOS tokens");
    t.format_ = ChatFormat::Mistral;
    t.bos_ = *bos;
    t.eos_ = *eos;
    t.end_of_turn_ = {*eos};
    t.reason_ = std::move(reason);
    return t;
  };

  if (choice == "none") {
    t.reason_ = "chat_template = none";
    return t;
  }
  if (choice == "chatml") return use_chatml("chat_template = chatml");
  if (choice == "mistral") return use_mistral("chat_template = mistral");
  if (choice == "tulu") return use_tulu("chat_template = tulu");
  // auto
  if (text.find("<|im_start|>") != std::string::npos && has_chatml)
    return use_chatml("the tokenizer_config.json chat_template uses <|im_start|>");
  if (text.find("[INST]") != std::string::npos)
    return use_mistral("the tokenizer_config.json chat_template uses [INST]");
  // Tulu's user turn ends with a newline; Zephyr's, which shares the
  // markers, with eos_token, and is not this template.
  if (text.find(R"('<|user|>\n' + message['content'] + '\n')") != std::string::npos &&
      text.find("<|assistant|>") != std::string::npos)
    return use_tulu("the tokenizer_config.json chat_template is Tulu's (<|user|>, <|assistant|>)");
  if (text.empty() && has_chatml) return use_chatml("no chat_template; the vocabulary has <|im_start|>");
  if (text.empty() && model_type == "mixtral") return use_mistral("no chat_template; the model is Mixtral");
  t.reason_ = text.empty() ? "no chat_template and no known chat tokens"
                           : "the tokenizer's chat_template is not one the server knows (set chat_template)";
  return t;
}

std::string_view ChatTemplate::name() const {
  switch (format_) {
    case ChatFormat::ChatML: return "chatml";
    case ChatFormat::Mistral: return "mistral";
    case ChatFormat::Tulu: return "tulu";
    case ChatFormat::None: break;
  }
  return "none";
}

Expected<std::vector<std::int32_t>> ChatTemplate::apply(const std::vector<ChatMessage>& messages,
                                                        bool add_generation_prompt) const {
  if (format_ == ChatFormat::None)
    return ApiError::invalid(fmt::format("this server has no chat template for the model ({}); use "
                                         "/v1/completions or start it with chat_template=chatml|mistral|tulu",
                                         reason_),
                             "messages", "chat_template_unavailable");
  if (messages.empty()) return ApiError::invalid("messages must not be empty", "messages");
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (!known_role(messages[i].role))
      return ApiError::invalid(fmt::format("messages[{}].role \"{}\" is not one of system, user, assistant", i,
                                           quote_untrusted(messages[i].role)),
                               fmt::format("messages[{}].role", i));
  }
  switch (format_) {
    case ChatFormat::ChatML: return apply_chatml(messages, add_generation_prompt);
    case ChatFormat::Mistral: return apply_mistral(messages);
    case ChatFormat::Tulu: return apply_tulu(messages, add_generation_prompt);
    case ChatFormat::None: break;
  }
  return ApiError::internal("no chat template");
}

Expected<std::vector<std::int32_t>> ChatTemplate::apply_chatml(const std::vector<ChatMessage>& messages,
                                                               bool add_generation_prompt) const {
  Pieces pieces(*tokenizer_);
  if (!default_system_.empty() && messages.front().role != "system") {
    pieces.id(im_start_);
    pieces.text("system\n" + default_system_);
    pieces.id(im_end_);
    pieces.text("\n");
  }
  // The last user message that is not a tool's response wrapped as one.
  std::size_t last_query = messages.size() - 1;
  for (std::size_t i = messages.size(); i-- > 0;) {
    const std::string_view content = messages[i].content;
    if (messages[i].role == "user" && !(content.starts_with("<tool_response>") && content.ends_with("</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    pieces.id(im_start_);
    pieces.text(message.role);
    pieces.text("\n");
    if (strips_reasoning_ && message.role == "assistant")
      pieces.text(assistant_turn(message.content, i > last_query, i + 1 == messages.size()));
    else
      pieces.text(message.content);
    pieces.id(im_end_);
    pieces.text("\n");
  }
  if (add_generation_prompt) {
    pieces.id(im_start_);
    pieces.text("assistant\n");
  }
  return pieces.finish();
}

Expected<std::vector<std::int32_t>> ChatTemplate::apply_tulu(const std::vector<ChatMessage>& messages,
                                                             bool add_generation_prompt) const {
  Pieces pieces(*tokenizer_);
  if (bos_ >= 0) pieces.id(bos_);
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    const bool last = i + 1 == messages.size();
    pieces.marker("<|" + message.role + "|>");
    pieces.text("\n");
    pieces.text(message.content);
    if (message.role == "assistant") {
      pieces.id(eos_);
      if (!last) pieces.text("\n");
    } else {
      pieces.text("\n");
    }
  }
  if (add_generation_prompt) {
    pieces.marker("<|assistant|>");
    pieces.text("\n");
  }
  return pieces.finish();
}

Expected<std::vector<std::int32_t>> ChatTemplate::apply_mistral(const std::vector<ChatMessage>& messages) const {
  // Fold a leading system message into the first user turn, as the common
  // Mistral templates with system support do.
  std::vector<ChatMessage> turns(messages.begin(), messages.end());
  if (turns.front().role == "system") {
    std::string system = turns.front().content;
    turns.erase(turns.begin());
    if (turns.empty() || turns.front().role != "user")
      return ApiError::invalid("the Mistral template needs a user message after the system message", "messages");
    turns.front().content = system + "\n\n" + turns.front().content;
  }
  Pieces pieces(*tokenizer_);
  pieces.id(bos_);
  for (std::size_t i = 0; i < turns.size(); ++i) {
    const std::string expected = i % 2 == 0 ? "user" : "assistant";
    if (turns[i].role != expected)
      return ApiError::invalid(fmt::format("the Mistral template needs roles alternating user/assistant "
                                           "(after an optional first system message); turn {} is {}",
                                           i, turns[i].role),
                               "messages");
    if (expected == "user") {
      pieces.text("[INST] ");
      pieces.text(turns[i].content);
      pieces.text(" [/INST]");
    } else {
      pieces.text(turns[i].content);
      pieces.id(eos_);
    }
  }
  return pieces.finish();
}

}  // namespace colibri::server

// Built-in chat templates (no Jinja interpreter): the server recognises the
// families' templates and renders their equivalent in C++.
//
//   ChatML   <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
//            Qwen2/Qwen3-MoE, the test fixtures, OLMoE-style ChatML models.
//   Mistral  <s>[INST] {user} [/INST]{assistant}</s>[INST] ... [/INST]
//            Mixtral-8x7B-Instruct; a system message is prepended to the first
//            user message, roles must alternate user/assistant.
//   Tulu     {bos}<|system|>\n{system}\n<|user|>\n{user}\n<|assistant|>\n{assistant}{eos}\n
//            ... <|assistant|>\n   OLMoE-1B-7B-Instruct (and OLMo-2's Tulu
//            template): the markers are text unless the vocabulary has them
//            as special tokens; the last assistant turn has no \n after EOS.
//
// Safety: message content is tokenized WITHOUT recognising special tokens, so
// "<|im_start|>system" typed by a user stays literal text; the template's own
// control tokens are inserted as ids. Text between two control tokens is
// tokenized as one run, as Hugging Face does when it splits the rendered
// template on added tokens (for byte-level BPE this gives identical ids).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api.h"
#include "core/result.h"
#include "model/model.h"

namespace colibri::server {

enum class ChatFormat { None, ChatML, Mistral, Tulu };

class ChatTemplate {
 public:
  // choice: "auto", "chatml", "mistral", "tulu" or "none" (the chat_template option).
  static Result<ChatTemplate> select(const Model& model, std::string_view choice);

  ChatFormat format() const { return format_; }
  std::string_view name() const;
  // Why this template was chosen (logged at start).
  const std::string& reason() const { return reason_; }

  // Token ids of the rendered conversation; 400 errors for roles the template
  // cannot render.
  Expected<std::vector<std::int32_t>> apply(const std::vector<ChatMessage>& messages,
                                            bool add_generation_prompt) const;
  // Ids that end an assistant turn (besides the model's EOS).
  const std::vector<std::int32_t>& end_of_turn() const { return end_of_turn_; }

 private:
  ChatTemplate() = default;
  Expected<std::vector<std::int32_t>> apply_chatml(const std::vector<ChatMessage>& messages,
                                                   bool add_generation_prompt) const;
  Expected<std::vector<std::int32_t>> apply_mistral(const std::vector<ChatMessage>& messages) const;
  static std::string assistant_turn(std::string_view text, bool after_last_query, bool last);
  Expected<std::vector<std::int32_t>> apply_tulu(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt) const;

  ChatFormat format_ = ChatFormat::None;
  std::string reason_;
  std::optional<Tokenizer> tokenizer_;
  std::int32_t im_start_ = -1, im_end_ = -1, bos_ = -1, eos_ = -1;
  // ChatML: the system turn the template adds when the conversation has none
  // (Qwen1.5/Qwen2: "You are a helpful assistant"); empty: none.
  std::string default_system_;
  // ChatML as Qwen3 renders it: an assistant turn before the last user message
  // keeps only its text after </think> (the reasoning is dropped from the
  // history), a later one has its reasoning put back in <think> tags.
  bool strips_reasoning_ = false;
  std::vector<std::int32_t> end_of_turn_;
};

}  // namespace colibri::server

// colibri-run: generate text from a model on the command line.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/text_file.h"

#include "model/model.h"
#include "runtime/batch_decoder.h"
#include "runtime/generator.h"
#include "runtime/session.h"
#include "kv_cache_flag.h"
#include "activations_flags.h"
#include "store_flags.h"
#include "weights_flags.h"
#include "json_text.h"

namespace {

using colibri::Result;

constexpr int kTopLogits = 64;

Result<std::vector<std::int32_t>> parse_ids(const std::string& text) {
  std::vector<std::int32_t> ids;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (item.empty()) continue;
    try {
      std::size_t used = 0;
      long long value = std::stoll(item, &used);
      if (used != item.size() || value < INT32_MIN || value > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(static_cast<std::int32_t>(value));
    } catch (const std::exception&) {
      return colibri::make_error("--prompt-ids: '{}' is not a token id", item);
    }
  }
  return ids;
}

// One prompt position in the layout of the fixtures' reference.json.
nlohmann::json position_record(std::int32_t pos, std::int32_t token, std::span<const float> logits) {
  std::vector<std::int32_t> order(logits.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int32_t>(i);
  std::size_t top = std::min<std::size_t>(kTopLogits, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(top), order.end(),
                    [&](std::int32_t a, std::int32_t b) {
                      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
                    });
  double max = logits[static_cast<std::size_t>(order[0])];
  double sum = 0.0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max);
  nlohmann::json pairs = nlohmann::json::array();
  for (std::size_t i = 0; i < top; ++i) pairs.push_back({order[i], logits[static_cast<std::size_t>(order[i])]});
  return {{"pos", pos}, {"token", token}, {"max", max}, {"lse", max + std::log(sum)},
          {"argmax", order[0]}, {"top", pairs}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "colibri-run: generate text with a Mixture-of-Experts model.\n\n"
      "Examples:\n"
      "  colibri-run --model ./Qwen1.5-MoE-A2.7B --prompt \"The capital of France is\"\n"
      "  colibri-run --model ./model --prompt-ids 51,459,220 --max-tokens 32 --logits-out out.json\n"};
  std::string model_path, prompt, prompt_ids, logits_out, dump_tensors;
  colibri::GenerateOptions options;
  options.max_tokens = 128;
  std::int32_t context = 0;
  bool parse_special = false, no_special = false, quiet = false;
  app.add_option("-m,--model", model_path,
                 "Hugging Face model directory (config.json, *.safetensors, tokenizer.json)")
      ->required();
  auto* prompt_opt = app.add_option("-p,--prompt", prompt, "Prompt text");
  auto* ids_opt = app.add_option("--prompt-ids", prompt_ids, "Prompt as comma-separated token ids");
  std::string prompt_file;
  auto* file_opt = app.add_option("-f,--prompt-file", prompt_file, "Read the prompt text from a file (exact bytes)");
  prompt_opt->excludes(ids_opt)->excludes(file_opt);
  ids_opt->excludes(file_opt);
  app.add_option("-n,--max-tokens", options.max_tokens, "Tokens to generate")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", options.sampling.temperature,
                 "Sampling temperature; 0 is greedy (the default: runs are reproducible)")
      ->capture_default_str();
  app.add_option("--top-k", options.sampling.top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
  app.add_option("--top-p", options.sampling.top_p, "Nucleus sampling mass (1 = off)")->capture_default_str();
  app.add_option("--min-p", options.sampling.min_p, "Drop tokens below min-p x the best one's probability (0 = off)")
      ->capture_default_str();
  app.add_option("--repeat-penalty", options.sampling.repetition_penalty, "Repetition penalty (1 = off)")
      ->capture_default_str();
  app.add_option("--presence-penalty", options.sampling.presence_penalty, "OpenAI presence penalty")
      ->capture_default_str();
  app.add_option("--frequency-penalty", options.sampling.frequency_penalty, "OpenAI frequency penalty")
      ->capture_default_str();
  app.add_option("--penalty-last-n", options.sampling.penalty_last_n,
                 "How many recent tokens the penalties look at (-1 = all)")->capture_default_str();
  app.add_option("--seed", options.sampling.seed, "Random seed for sampling")->capture_default_str();
  app.add_option("--stop", options.stop, "Stop when this text appears (repeatable)");
  app.add_flag("--ignore-eos", options.ignore_eos, "Keep generating past the end-of-sequence token");
  bool json_object = false;
  app.add_flag("--json-object", json_object,
               "Constrain the output to one JSON object; generation ends when it closes (as the server's "
               "response_format json_object)");
  app.add_option("-c,--context", context,
                 "Context length (0 = the model's, at most 4096; more than the model's is refused)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--parse-special", parse_special,
               "Let special-token text in the prompt (e.g. <|im_start|>) become control tokens");
  app.add_flag("--no-special", no_special, "Do not add BOS/EOS tokens to the prompt");
  app.add_option("--logits-out", logits_out,
                 "Write prompt ids, the top-64 logits of every prompt position and the generated "
                 "tokens as JSON (the layout of the test fixtures' reference.json)");
  app.add_option("--dump-tensors", dump_tensors,
                 "Write every named intermediate tensor (per layer and position) as JSON lines; a prompt "
                 "is fed in batches, so its lines come layer by layer for all its positions (use the "
                 "\"pos\" field)");
  app.add_flag("-q,--quiet", quiet, "Print only the generated text");
  colibri_tools::PrefillActivationsFlag prefill_activations;
  prefill_activations.add(app);
  colibri_tools::DecodeActivationsFlag decode_activations;
  decode_activations.add(app);
  colibri_tools::StoreFlags store_flags;
  store_flags.add(app);
  colibri_tools::WeightsFlags weights_flags;
  weights_flags.add(app);
  colibri_tools::KvCacheFlag kv_cache_flag;
  kv_cache_flag.add(app);
  CLI11_PARSE(app, argc, argv);

  auto model = colibri::Model::load(model_path, weights_flags.load_options(store_flags.cache_mb > 0));
  if (!model) {
    std::fprintf(stderr, "colibri-run: %s\n", model.error().message.c_str());
    return 1;
  }
  const colibri::Tokenizer& tokenizer = (*model)->tokenizer();
  // A longer context than the model's positions was cut to them silently.
  if (context > (*model)->config().max_positions) {
    std::fprintf(stderr, "colibri-run: --context %d is more than the model's %d positions (max_position_embeddings)\n",
                 context, (*model)->config().max_positions);
    return 2;
  }

  if (!prompt_file.empty()) {
    // A directory, a FIFO or a read error is refused; read through an
    // ifstream, a directory read as an empty prompt and the run went on.
    auto text = colibri::read_text_file(prompt_file);
    if (!text) {
      std::fprintf(stderr, "colibri-run: prompt file: %s\n", text.error().message.c_str());
      return 2;
    }
    prompt = std::move(text).value();
  }

  std::vector<std::int32_t> tokens;
  if (!prompt_ids.empty()) {
    auto ids = parse_ids(prompt_ids);
    if (!ids) {
      std::fprintf(stderr, "colibri-run: %s\n", ids.error().message.c_str());
      return 2;
    }
    tokens = std::move(ids).value();
  } else {
    colibri::EncodeOptions encode;
    encode.parse_special = parse_special;
    encode.add_special_tokens = !no_special;
    auto ids = tokenizer.encode(prompt, encode);
    if (!ids) {
      std::fprintf(stderr, "colibri-run: %s\n", ids.error().message.c_str());
      return 2;
    }
    tokens = std::move(ids).value();
  }

  auto store = store_flags.open(*model);
  if (!store) {
    std::fprintf(stderr, "colibri-run: %s\n", store.error().message.c_str());
    return 1;
  }
  if (*store && !(*store)->io_note().empty() && !quiet)
    std::fprintf(stderr, "colibri-run: %s\n", (*store)->io_note().c_str());
  if (!(*model)->weights_lock_error().empty())
    std::fprintf(stderr, "colibri-run: --mlock: %s\n", (*model)->weights_lock_error().c_str());
  colibri::Session session(*model, context, nullptr, colibri::Session::kDefaultPrefillBatch, store->get(),
                           kv_cache_flag.type());
  prefill_activations.apply(session);
  decode_activations.apply(session);
  // Checked before the run, which may be long: it was found unwritable only
  // after it, and the logits were lost.
  if (!logits_out.empty() && !std::ofstream(logits_out, std::ios::app)) {
    std::fprintf(stderr, "colibri-run: cannot write %s\n", logits_out.c_str());
    return 1;
  }
  std::ofstream dump;
  if (!dump_tensors.empty()) {
    dump.open(dump_tensors);
    if (!dump) {
      std::fprintf(stderr, "colibri-run: cannot write %s\n", dump_tensors.c_str());
      return 1;
    }
    session.set_tensor_hook([&dump](std::string_view name, std::int32_t layer, std::int32_t position,
                                    std::span<const float> values) {
      nlohmann::json line = {{"name", name}, {"layer", layer}, {"pos", position},
                             {"values", std::vector<float>(values.begin(), values.end())}};
      dump << colibri_tools::json_text(line) << '\n';
    });
  }

  nlohmann::json positions = nlohmann::json::array();
  auto observer = [&](std::int32_t position, std::span<const float> logits) {
    if (!logits_out.empty() && static_cast<std::size_t>(position) < tokens.size())
      positions.push_back(position_record(position, tokens[static_cast<std::size_t>(position)], logits));
  };
  auto on_text = [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  };

  colibri::JsonVocabulary json_vocabulary({}, {});
  if (json_object) {
    json_vocabulary = colibri::json_vocabulary(tokenizer);
    options.json = &json_vocabulary;
  }
  auto start = std::chrono::steady_clock::now();
  // Without --logits-out the prompt goes through the layers in batches
  // (Session::prefill); the observer would need every position's logits.
  auto output = colibri::generate(session, tokens, options, on_text,
                                  logits_out.empty() ? colibri::LogitsObserver{} : colibri::LogitsObserver(observer));
  auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!output) {
    std::fprintf(stderr, "colibri-run: %s\n", output.error().message.c_str());
    return 2;
  }
  if (!quiet)
    std::fprintf(stderr, "colibri-run: %zu prompt tokens, %zu generated, finish=%s, %.2f s (%.1f tokens/s)\n",
                 tokens.size(), output->tokens.size(),
                 std::string(colibri::finish_reason_name(output->finish)).c_str(), seconds,
                 static_cast<double>(tokens.size() + output->tokens.size()) / seconds);
  if (!quiet && *store) {
    const colibri::ExpertStoreTotals t = (*store)->totals();
    std::fprintf(stderr,
                 "colibri-run: expert store %llu slots of %.2f MiB: hit rate %.3f, %.1f MB read, stall %.2f s, "
                 "%llu evictions\n",
                 static_cast<unsigned long long>((*store)->slot_count()),
                 static_cast<double>((*store)->slot_bytes()) / 1048576.0, t.hit_rate(),
                 static_cast<double>(t.bytes_read) / 1e6, static_cast<double>(t.stall_ns) / 1e9,
                 static_cast<unsigned long long>(t.evictions));
    if (t.preloaded > 0)
      std::fprintf(stderr, "colibri-run: preloaded %llu experts at open (%.1f MB, in the MB read above) in %.2f s\n",
                   static_cast<unsigned long long>(t.preloaded), static_cast<double>(t.preload_bytes) / 1e6,
                   static_cast<double>(t.preload_ns) / 1e9);
    const colibri::ExpertPredictionCounts& p = session.decoder().prediction_counts();
    if (p.chosen > 0)
      std::fprintf(stderr, "colibri-run: next-layer prediction: %llu of %llu chosen experts predicted (%.3f)\n",
                   static_cast<unsigned long long>(p.predicted), static_cast<unsigned long long>(p.chosen),
                   static_cast<double>(p.predicted) / static_cast<double>(p.chosen));
  }

  if (!logits_out.empty()) {
    nlohmann::json prompt_record = {
        {"prompt_id", "colibri-run"},
        {"prompt", prompt_ids.empty() ? prompt : std::string()},
        {"tokens", tokens},
        {"positions", positions},
        {"generated", {{"n", output->tokens.size()}, {"tokens", output->tokens}}}};
    nlohmann::json root = {{"format", "colibri-logits-v1"},
                           {"model", model_path},
                           {"n_vocab", (*model)->config().vocab},
                           {"prompts", nlohmann::json::array({prompt_record})}};
    std::ofstream out(logits_out);
    out << colibri_tools::json_text(root) << '\n';
    if (!out) {
      std::fprintf(stderr, "colibri-run: cannot write %s\n", logits_out.c_str());
      return 1;
    }
  }
  return 0;
}

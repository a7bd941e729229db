// colibri-perplexity: perplexity of a model over a text file, and its
// divergence from a base model.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "routing_flags.h"
#include "text_file_tokens.h"
#include "runtime/perplexity.h"
#include "runtime/routing_fidelity.h"
#include "json_text.h"

int main(int argc, char** argv) {
  CLI::App app{
      "colibri-perplexity: perplexity of a model over a text file.\n\n"
      "The text is tokenized without special tokens and scored in windows of --context tokens\n"
      "whose starts advance by --stride; each window scores its last --stride predictions (the\n"
      "first window scores all). With --kl-base, the same windows run through a second model and\n"
      "the mean KL divergence KL(base || model) over the whole vocabulary and the top-1\n"
      "agreement are reported, e.g. an int8 file against its f32 source.\n\n"
      "Example:\n"
      "  colibri-perplexity --model model-int8.colibri --kl-base ./model-dir --text held-out.txt\n\n"
      "With --routing MODE (int8, group-limited, hash, load-aware, or all), the model runs once with\n"
      "standard routing and once per mode, and each mode's cost is reported the same way:\n"
      "  colibri-perplexity --model models/default --text held-out.txt --routing all\n"};
  std::string model_path, base_path, text_path;
  colibri::PerplexityOptions options;
  bool json = false, parse_special = false;
  app.add_option("-m,--model", model_path, "Model to score (directory, .gguf or .colibri)")->required();
  app.add_option("-t,--text", text_path, "UTF-8 text file")->required()->check(CLI::ExistingFile);
  app.add_option("--kl-base", base_path, "Base model to compare next-token distributions with");
  app.add_option("-c,--context", options.context, "Tokens per window")->capture_default_str();
  app.add_option("-s,--stride", options.stride, "Window advance (= context: no overlap)")->capture_default_str();
  app.add_option("--max-tokens", options.max_tokens, "Score at most this many tokens (0 = all)")
      ->capture_default_str();
  colibri_tools::RoutingFlags routing;
  routing.add(app);
  app.add_flag("--json", json, "Print the result as JSON");
  app.add_flag("--parse-special", parse_special,
               "Let special-token text in the file (e.g. <|endoftext|> between documents) become "
               "control tokens");
  CLI11_PARSE(app, argc, argv);

  auto model = colibri::Model::load(model_path);
  if (!model) {
    std::fprintf(stderr, "colibri-perplexity: %s\n", model.error().message.c_str());
    return 1;
  }
  std::shared_ptr<const colibri::Model> base;
  if (!base_path.empty()) {
    auto loaded = colibri::Model::load(base_path);
    if (!loaded) {
      std::fprintf(stderr, "colibri-perplexity: %s\n", loaded.error().message.c_str());
      return 1;
    }
    base = *loaded;
  }
  auto tokens = colibri_tools::encode_text_file((*model)->tokenizer(), text_path, parse_special);
  if (!tokens) {
    std::fprintf(stderr, "colibri-perplexity: %s: %s\n", text_path.c_str(), tokens.error().message.c_str());
    return 1;
  }
  if (!json)
    options.progress = [](std::int64_t done, std::int64_t total) {
      std::fprintf(stderr, "\rscored %lld/%lld tokens", static_cast<long long>(done), static_cast<long long>(total));
    };
  if (routing.enabled()) {
    if (base) {
      std::fprintf(stderr, "colibri-perplexity: --routing compares the model with itself; drop --kl-base\n");
      return 2;
    }
    const auto modes = routing.modes();
    if (!modes) {
      std::fprintf(stderr, "colibri-perplexity: %s\n", routing.refusal().c_str());
      return 2;
    }
    auto rows = colibri::measure_routing_fidelity(*model, *tokens, *modes, options);
    if (!json) std::fputc('\n', stderr);
    if (!rows) {
      std::fprintf(stderr, "colibri-perplexity: %s\n", rows.error().message.c_str());
      return 1;
    }
    nlohmann::json out = nlohmann::json::array();
    if (!json) std::printf("%s\n", colibri_tools::routing_table_header().c_str());
    for (const auto& row : *rows) {
      if (json)
        out.push_back(colibri_tools::routing_row_json(row));
      else
        std::printf("%s\n", colibri_tools::routing_table_row(row).c_str());
    }
    if (json) std::printf("%s\n", colibri_tools::json_text(out, 2).c_str());
    return 0;
  }
  auto result = colibri::measure_perplexity(*model, base, *tokens, options);
  if (!json) std::fputc('\n', stderr);
  if (!result) {
    std::fprintf(stderr, "colibri-perplexity: %s\n", result.error().message.c_str());
    return 1;
  }
  if (json) {
    nlohmann::json out = {{"model", model_path},         {"text", text_path},
                          {"context", options.context},  {"stride", options.stride},
                          {"tokens_scored", result->scored}, {"perplexity", result->perplexity()}};
    if (base) {
      out["base"] = base_path;
      out["base_perplexity"] = result->base_perplexity();
      out["mean_kl"] = result->mean_kl();
      out["top1_agreement"] = result->top1_agreement();
    }
    std::printf("%s\n", colibri_tools::json_text(out, 2).c_str());
  } else {
    std::printf("model       %s\ntokens      %lld scored (context %d, stride %d)\nperplexity  %.4f\n",
                model_path.c_str(), static_cast<long long>(result->scored), options.context, options.stride,
                result->perplexity());
    if (base)
      std::printf("base        %s\nbase ppl    %.4f\nmean KL     %.6f\ntop-1 agree %.4f\n", base_path.c_str(),
                  result->base_perplexity(), result->mean_kl(), result->top1_agreement());
  }
  return 0;
}

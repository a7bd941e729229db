/* generate.c - the C interface in one page: load a model, generate with
 * streamed output, tokenize, and use the model's router shape for a routing
 * call.
 *
 *   colibri-example-generate MODEL PROMPT [MAX_TOKENS]
 *
 * Prints the generated text (greedy, as colibri-run) on stdout and a summary on
 * stderr. Built with the project and run by tests/scripts/c_example.sh. */
#include <colibri/colibri.h>

#include <stdio.h>
#include <stdlib.h>

static int print_piece(const char* text, size_t len, void* user_data) {
  size_t* pieces = (size_t*)user_data;
  fwrite(text, 1, len, stdout);
  fflush(stdout);
  ++*pieces;
  return 1; /* 0 would stop the generation */
}

static int fail(const char* what, colibri_status status) {
  fprintf(stderr, "%s failed: %s: %s\n", what, colibri_status_name(status), colibri_last_error());
  return 1;
}

int main(int argc, char** argv) {
  colibri_model* model = NULL;
  colibri_result* result = NULL;
  colibri_router* router = NULL;
  colibri_inference_params params;
  colibri_model_stats stats;
  colibri_status status;
  int32_t* ids = NULL;
  size_t n_ids = 0, pieces = 0, i;
  float* logits = NULL;
  int32_t* experts = NULL;
  float* weights = NULL;
  int exit_code = 1;

  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL PROMPT [MAX_TOKENS]\n", argv[0]);
    return 2;
  }

  status = colibri_load_model(argv[1], NULL, &model);
  if (status != COLIBRI_OK) return fail("colibri_load_model", status);

  stats.struct_size = sizeof stats;
  status = colibri_model_info(model, &stats);
  if (status != COLIBRI_OK) {
    exit_code = fail("colibri_model_info", status);
    goto done;
  }
  fprintf(stderr, "model: %s, %d layers, %d experts (top-%d), vocab %d, %llu bytes of %s weights\n",
          stats.arch_name, stats.n_layers, stats.n_experts, stats.top_k, stats.vocab,
          (unsigned long long)stats.weight_bytes, stats.weight_scheme);

  status = colibri_tokenize(model, argv[2], COLIBRI_TOKENIZE_ADD_SPECIAL, &ids, &n_ids);
  if (status != COLIBRI_OK) {
    exit_code = fail("colibri_tokenize", status);
    goto done;
  }
  fprintf(stderr, "prompt: %zu tokens\n", n_ids);

  params = colibri_inference_params_default(); /* greedy, like colibri-run */
  if (argc > 3) params.max_tokens = atoi(argv[3]);
  params.on_text = print_piece;
  params.user_data = &pieces;
  status = colibri_inference(model, argv[2], &params, &result);
  fputc('\n', stdout);
  if (status != COLIBRI_OK) {
    exit_code = fail("colibri_inference", status);
    goto done;
  }
  fprintf(stderr, "generated %zu tokens in %zu pieces, finish=%s, first ids:", result->n_tokens, pieces,
          colibri_finish_reason_name((colibri_finish_reason)result->finish_reason));
  for (i = 0; i < result->n_tokens && i < 8; ++i) fprintf(stderr, " %d", result->tokens[i]);
  fputc('\n', stderr);

  /* Routing: the model's router shape, over made-up gate logits. */
  {
    colibri_router_config config = colibri_router_config_default();
    config.num_experts = stats.n_experts;
    config.top_k = stats.top_k;
    config.normalize = stats.norm_top_k;
    status = colibri_init_with_config(&config, &router);
    if (status != COLIBRI_OK) {
      exit_code = fail("colibri_init_with_config", status);
      goto done;
    }
  }
  logits = (float*)malloc(sizeof(float) * (size_t)stats.n_experts);
  experts = (int32_t*)malloc(sizeof(int32_t) * (size_t)stats.top_k);
  weights = (float*)malloc(sizeof(float) * (size_t)stats.top_k);
  if (logits == NULL || experts == NULL || weights == NULL) goto done;
  for (i = 0; i < (size_t)stats.n_experts; ++i) logits[i] = (float)((i * 7) % 5) - 0.5f * (float)i;
  status = colibri_route_experts(router, logits, experts, weights);
  if (status != COLIBRI_OK) {
    exit_code = fail("colibri_route_experts", status);
    goto done;
  }
  fprintf(stderr, "route:");
  for (i = 0; i < (size_t)stats.top_k; ++i) fprintf(stderr, " expert %d (%.4f)", experts[i], weights[i]);
  fputc('\n', stderr);

  /* Invalid arguments are errors with a message, never a crash. */
  status = colibri_route_experts(router, NULL, experts, weights);
  fprintf(stderr, "expected error: %s: %s\n", colibri_status_name(status), colibri_last_error());
  exit_code = status == COLIBRI_ERR_NULL_POINTER ? 0 : 1;

done:
  free(logits);
  free(experts);
  free(weights);
  colibri_free(router);
  colibri_free_tokens(ids);
  colibri_free_result(result);
  colibri_unload_model(model);
  return exit_code;
}

/*
 * colibri.h - the stable C interface of libcolibri.
 *
 * Plain C (C99 or later; also valid C++), no C++ types, no exception ever
 * leaves a function declared here. Link with -lcolibri (libcolibri.so).
 *
 * ---------------------------------------------------------------------------
 * Errors
 * ---------------------------------------------------------------------------
 * Every function that can fail returns a colibri_status. COLIBRI_OK (0) means
 * success; any other value is an error and colibri_last_error() then returns a
 * human-readable message naming the function, the argument and the value.
 * On error, out-parameters that are handles or buffers (colibri_model**,
 * colibri_result**, int32_t**, char**, colibri_router**) are set to NULL when
 * the out-pointer itself is not NULL; caller-provided output arrays (routing
 * experts/weights) have unspecified contents.
 *
 *   COLIBRI_OK                    success.
 *   COLIBRI_ERR_INVALID_ARGUMENT  a value is not allowed: num_experts < 1, top_k
 *                                 outside [1, num_experts], NaN or infinite gate
 *                                 logits, sampling parameters out of range, an
 *                                 unknown flag bit or enum value, a boolean field
 *                                 not 0/1, a struct whose struct_size does not
 *                                 match this header, text that is not valid
 *                                 UTF-8, an empty prompt.
 *   COLIBRI_ERR_NULL_POINTER      a required pointer argument (or a stop string)
 *                                 is NULL.
 *   COLIBRI_ERR_LOAD              a model could not be loaded: missing or
 *                                 unreadable file, unsupported architecture,
 *                                 corrupt or inconsistent weights, bad tokenizer.
 *   COLIBRI_ERR_OUT_OF_RANGE      a token id is outside [0, vocab), n_ctx is
 *                                 larger than the model's maximum, num_experts is
 *                                 above COLIBRI_MAX_EXPERTS, or a size computation
 *                                 (n_tokens * num_experts) overflows.
 *   COLIBRI_ERR_CONTEXT_FULL      the prompt has more tokens than the context
 *                                 (n_ctx) holds. (Running out of context while
 *                                 generating is not an error: the result's
 *                                 finish_reason is COLIBRI_FINISH_CONTEXT_FULL.)
 *   COLIBRI_ERR_UNSUPPORTED       the request is well-formed but this build
 *                                 cannot do it (see colibri_set_cache_policy).
 *   COLIBRI_ERR_OUT_OF_MEMORY     an allocation failed; nothing was changed.
 *   COLIBRI_ERR_INTERNAL          an unexpected failure inside the engine (for
 *                                 instance a model whose logits are all NaN);
 *                                 the message says what happened.
 *
 * colibri_last_error() is thread-local: it describes the last call made on
 * the calling thread that returns a colibri_status (it is "" after a call
 * that succeeded). The pointer stays valid until the next such call on the
 * same thread. Functions returning void or a static string never change it.
 *
 * ---------------------------------------------------------------------------
 * Ownership
 * ---------------------------------------------------------------------------
 * Everything the library allocates is released by exactly one matching call,
 * each of which accepts NULL and then does nothing:
 *   colibri_model*   colibri_load_model        -> colibri_unload_model
 *   colibri_result*  colibri_inference[_tokens] -> colibri_free_result
 *                    (its tokens and text belong to it: do not free them)
 *   int32_t*         colibri_tokenize          -> colibri_free_tokens
 *   char*            colibri_detokenize        -> colibri_free_text
 *   colibri_router*  colibri_init[_with_config] -> colibri_free
 * Pointers passed in (paths, prompts, logits, option structs, stop strings,
 * output arrays) are borrowed for the duration of the call only; the library
 * keeps none of them. Strings returned by colibri_version, colibri_kernels,
 * colibri_status_name and colibri_finish_reason_name are static. The strings
 * in a colibri_model_stats belong to the model and live until it is unloaded.
 * Library buffers (result tokens/text, tokenize output) are never NULL on
 * success, even when their length is 0.
 *
 * ---------------------------------------------------------------------------
 * Thread safety
 * ---------------------------------------------------------------------------
 * A loaded model is immutable: any number of threads may call
 * colibri_inference[_tokens], colibri_tokenize, colibri_detokenize and
 * colibri_model_info on the same model at once (each inference has its own
 * context). colibri_unload_model must not run concurrently with any other call
 * that uses that model. A router keeps scratch memory so that routing never
 * allocates: use a router from one thread at a time (create one per thread;
 * they are small). Distinct routers, results and buffers are independent.
 *
 * ---------------------------------------------------------------------------
 * Versioned structs
 * ---------------------------------------------------------------------------
 * Each struct passed in either direction starts with `size_t struct_size`,
 * which must equal sizeof(the struct) as seen by the caller's header; a
 * mismatch is COLIBRI_ERR_INVALID_ARGUMENT, so a program built against another
 * version of this header fails loudly instead of being misread. Obtain input
 * structs from their *_default() function, which fills struct_size and the
 * defaults, then change the fields you need. New fields are only ever appended.
 */
#ifndef COLIBRI_COLIBRI_H
#define COLIBRI_COLIBRI_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(COLIBRI_BUILDING_LIBRARY)
#    define COLIBRI_API __declspec(dllexport)
#  else
#    define COLIBRI_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) && __GNUC__ >= 4
#  define COLIBRI_API __attribute__((visibility("default")))
#else
#  define COLIBRI_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this interface. It changes only when an existing declaration
 * changes incompatibly (additions keep it); compare with colibri_abi_version()
 * to detect a mismatched libcolibri at run time. */
#define COLIBRI_ABI_VERSION 1

/* ========================================================================= */
/* Status codes and errors                                                    */
/* ========================================================================= */

typedef enum colibri_status {
  COLIBRI_OK = 0,
  COLIBRI_ERR_INVALID_ARGUMENT = 1,
  COLIBRI_ERR_NULL_POINTER = 2,
  COLIBRI_ERR_LOAD = 3,
  COLIBRI_ERR_OUT_OF_RANGE = 4,
  COLIBRI_ERR_CONTEXT_FULL = 5,
  COLIBRI_ERR_UNSUPPORTED = 6,
  COLIBRI_ERR_OUT_OF_MEMORY = 7,
  COLIBRI_ERR_INTERNAL = 8
} colibri_status;

/* The message of the last failed call on this thread ("" if it succeeded).
 * Never NULL. Valid until the next status-returning call on this thread. */
COLIBRI_API const char* colibri_last_error(void);

/* The enumerator's name, e.g. "COLIBRI_ERR_LOAD"; "COLIBRI_UNKNOWN_STATUS" for
 * a value not listed above. Static storage. */
COLIBRI_API const char* colibri_status_name(colibri_status status);

/* Library version, e.g. "0.1.0". Static storage. */
COLIBRI_API const char* colibri_version(void);

/* The COLIBRI_ABI_VERSION the library was built with. */
COLIBRI_API int32_t colibri_abi_version(void);

/* The instruction-set path the kernels run on in this process: "amx",
 * "avx512", "avx2", "neon" or "scalar". Chosen once, the first time a kernel
 * runs (or this is asked), as the best the CPU supports; the environment
 * variable COLIBRI_ISA, read then, caps it. Static storage. */
COLIBRI_API const char* colibri_kernels(void);

/* ========================================================================= */
/* Models                                                                     */
/* ========================================================================= */

typedef struct colibri_model colibri_model;

/* How the expert store reads an expert's bytes (docs/EXPERT_STORE.md). */
typedef enum colibri_cache_io {
  COLIBRI_CACHE_IO_PREAD_DIRECT = 0, /* pread with O_DIRECT into the store's slots (default) */
  COLIBRI_CACHE_IO_PREAD = 1,        /* pread through the page cache */
  COLIBRI_CACHE_IO_MMAP = 2          /* the file mapping, populated on load, paged out on eviction */
} colibri_cache_io;

/* When the expert store reads experts into its budget before any inference
 * asks for them (docs/EXPERT_STORE.md). */
typedef enum colibri_cache_preload {
  COLIBRI_CACHE_PRELOAD_AUTO = 0, /* when the budget holds every expert (default):
                                     no inference then waits for an expert read */
  COLIBRI_CACHE_PRELOAD_ON = 1,   /* fill the budget even when it cannot hold every
                                     expert (the file's first experts) */
  COLIBRI_CACHE_PRELOAD_OFF = 2   /* read an expert when an inference first needs it */
} colibri_cache_preload;

typedef struct colibri_load_options {
  size_t struct_size;        /* sizeof(colibri_load_options) */
  int32_t verify_checksums;  /* 0 or 1. .colibri files: recompute every tensor
                                checksum before use (the header checksum is
                                always checked). Default 0. */
} colibri_load_options;

/* struct_size set, every field at its default. */
COLIBRI_API colibri_load_options colibri_load_options_default(void);

/* Loads a model from `path` (UTF-8, NUL-terminated):
 *   - a .colibri file (mapped in place: truncating or rewriting the file in
 *     place while it is loaded raises SIGBUS in the process at the next read
 *     of a lost page; replace files by rename, or load with
 *     COLIBRI_WEIGHTS_COPY),
 *   - a GGUF file (F32/F16/BF16, Q8_0, Q4_0..Q5_1 or Q2_K..Q6_K tensors, converted to f32),
 *   - a Hugging Face directory (config.json, *.safetensors, tokenizer.json,
 *     tokenizer_config.json; converted to f32).
 * `options` may be NULL (defaults). On success *out is a new model handle.
 * Errors: NULL_POINTER (path, out), INVALID_ARGUMENT (options), LOAD,
 * OUT_OF_MEMORY, INTERNAL. */
COLIBRI_API colibri_status colibri_load_model(const char* path, const colibri_load_options* options,
                                              colibri_model** out);

/* Where a .colibri file's weights live (converted checkpoints are always in
 * the process's own memory). A separate argument of its own function rather
 * than a field of colibri_load_options, for the reason given at
 * colibri_expert_cache_options below. */
typedef enum colibri_weights_memory {
  COLIBRI_WEIGHTS_MAP = 0,  /* the page cache's pages, mapped in place: instant,
                               shared with other processes, 4 KiB pages (what
                               colibri_load_model does) */
  COLIBRI_WEIGHTS_COPY = 1, /* read into huge-page memory at load: decode streams
                               the weights faster (1.57x on an OLMoE-shaped int8
                               file here, docs/BENCH.md); memory of its own */
  COLIBRI_WEIGHTS_AUTO = 2  /* COPY when the file fits in available memory
                               (MemAvailable, cgroup limit) with a tenth to
                               spare, else MAP */
} colibri_weights_memory;

/* colibri_load_model with the weights held as `memory` (a
 * colibri_weights_memory). An expert cache (colibri_model_enable_expert_cache)
 * needs MAP: it reads experts from the file. Errors: those of
 * colibri_load_model, INVALID_ARGUMENT for an unknown `memory`. */
COLIBRI_API colibri_status colibri_load_model_with_memory(const char* path, const colibri_load_options* options,
                                                          int32_t memory, colibri_model** out);

/* Releases a model. NULL is a no-op. No other call may be using it. */
COLIBRI_API void colibri_unload_model(colibri_model* model);

/* The expert store: bounded memory for a .colibri model's routed experts
 * (docs/EXPERT_STORE.md). A separate struct, not fields of
 * colibri_load_options, because *_default() returns structs by value: a
 * larger colibri_load_options would overrun the caller's copy in programs
 * built against the earlier header. */
typedef struct colibri_expert_cache_options {
  size_t struct_size;   /* sizeof(colibri_expert_cache_options) */
  uint64_t budget_mb;   /* MiB of experts resident at once (> 0). Below one
                           layer's top-k experts is LOAD, with the minimum in
                           the message. Default 0 (must be set). */
  int32_t policy;       /* a colibri_cache_policy. Default LRU. */
  int32_t io;           /* a colibri_cache_io. Default PREAD_DIRECT. */
  int32_t prefetch;     /* 0: read a missing expert when needed (default);
                           1: read a layer's missing experts in parallel on
                           loader threads; 2: also prefetch the next layer's
                           predicted experts. */
  const char* pinned_experts; /* never evicted, "layer:expert,..."; NULL or
                                 "" for none. Default NULL. */
  int32_t preload;      /* a colibri_cache_preload, read when
                           colibri_model_enable_expert_cache opens the store
                           (it then returns after the reads). Default AUTO; a
                           struct_size that ends before it (the earlier
                           header) means AUTO. */
} colibri_expert_cache_options;

/* struct_size set, every field at its default. */
COLIBRI_API colibri_expert_cache_options colibri_expert_cache_options_default(void);

/* Gives the model an expert store: from now on its inferences read routed
 * experts through it, at most budget_mb MiB resident, with exactly the same
 * results. The store is single-threaded, so inferences on this model then
 * run one at a time (concurrent colibri_inference calls wait for each other).
 * Replaces an earlier store, after the inferences driving it return; calls
 * already running keep the store they started with, so it may run beside
 * other calls on the model (not beside colibri_unload_model).
 * Errors: NULL_POINTER, INVALID_ARGUMENT (struct_size, a value outside its
 * enum, budget_mb 0 or too large, malformed pinned_experts), UNSUPPORTED (not
 * a .colibri model), LOAD (budget too small, pinned expert out of range, a
 * pinned or preloaded expert unreadable). */
COLIBRI_API colibri_status colibri_model_enable_expert_cache(colibri_model* model,
                                                             const colibri_expert_cache_options* options);

typedef struct colibri_model_stats {
  size_t struct_size;         /* caller sets sizeof(colibri_model_stats) */
  const char* arch;           /* config.json model_type, e.g. "mixtral" */
  const char* arch_name;      /* display name, e.g. "Mixtral" */
  const char* weight_scheme;  /* "f32" for checkpoints converted at load, else
                                 the .colibri file's quantization scheme */
  const char* path;           /* what the model was loaded from */
  int32_t n_layers;
  int32_t n_moe_layers;       /* layers with a routed-expert FFN */
  int32_t hidden;
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t head_dim;
  int32_t vocab;
  int32_t n_experts;          /* routed experts per MoE layer */
  int32_t top_k;              /* experts chosen per token */
  int32_t norm_top_k;         /* 1: the top-k weights are renormalised */
  int32_t expert_ff;
  int32_t shared_ff;          /* 0: no shared expert */
  int32_t max_positions;      /* the largest n_ctx accepted */
  int32_t bos_token_id;       /* -1 when the model has none */
  int32_t eos_token_id;       /* -1 when the model has none */
  uint64_t weight_bytes;      /* bytes of weights held (mapped or in memory) */
  /* The expert store (colibri_model_enable_expert_cache; all 0 without
   * one). A struct_size that ends before these fields (a program built
   * against the earlier header) is accepted; they are then not written. */
  uint64_t expert_cache_bytes;    /* the budget in effect (slots x slot size) */
  uint64_t expert_cache_hits;     /* acquires that found the expert resident or in flight */
  uint64_t expert_cache_misses;   /* acquires that had to read it */
  uint64_t expert_cache_bytes_read; /* including the preload's */
  uint64_t expert_cache_stall_ns; /* time inference waited for expert reads */
  /* The preload when the store opened (colibri_cache_preload). A struct_size
   * that ends before these (the earlier header) is accepted too. */
  uint64_t expert_cache_preload_bytes;
  uint64_t expert_cache_preload_ns;
} colibri_model_stats;

/* Fills *out (whose struct_size the caller has set). The strings belong to
 * the model. Errors: NULL_POINTER, INVALID_ARGUMENT (struct_size). */
COLIBRI_API colibri_status colibri_model_info(const colibri_model* model, colibri_model_stats* out);

/* ========================================================================= */
/* Tokenizer                                                                  */
/* ========================================================================= */

/* Flags of colibri_tokenize (OR them together). */
#define COLIBRI_TOKENIZE_ADD_SPECIAL 1u   /* add BOS/EOS as the model's tokenizer prescribes */
#define COLIBRI_TOKENIZE_PARSE_SPECIAL 2u /* let special-token text (e.g. "<|im_start|>") in
                                             the input become control tokens */

/* Encodes NUL-terminated UTF-8 `text` into a buffer the library allocates:
 * *tokens_out (free it with colibri_free_tokens) holds *n_tokens_out ids.
 * Errors: NULL_POINTER (model, text, tokens_out, n_tokens_out),
 * INVALID_ARGUMENT (unknown flag bits, invalid UTF-8), OUT_OF_MEMORY. */
COLIBRI_API colibri_status colibri_tokenize(const colibri_model* model, const char* text, uint32_t flags,
                                            int32_t** tokens_out, size_t* n_tokens_out);

/* Releases a buffer from colibri_tokenize. NULL is a no-op. */
COLIBRI_API void colibri_free_tokens(int32_t* tokens);

/* Flags of colibri_detokenize. */
#define COLIBRI_DETOKENIZE_SKIP_SPECIAL 1u /* leave special tokens (BOS, EOS, ...) out */

/* Decodes `n_tokens` ids into NUL-terminated UTF-8 text the library allocates:
 * *text_out (free it with colibri_free_text), *text_len_out bytes before the
 * NUL. `tokens` may be NULL only when n_tokens is 0. Ids the model has and
 * its tokenizer does not (an embedding padded past the tokenizer's
 * vocabulary, as Qwen's) are left out, as Hugging Face's decode does.
 * Errors: NULL_POINTER, INVALID_ARGUMENT (unknown flag bits), OUT_OF_RANGE
 * (an id outside [0, colibri_model_stats.vocab)), OUT_OF_MEMORY. */
COLIBRI_API colibri_status colibri_detokenize(const colibri_model* model, const int32_t* tokens, size_t n_tokens,
                                              uint32_t flags, char** text_out, size_t* text_len_out);

/* Releases text from colibri_detokenize. NULL is a no-op. */
COLIBRI_API void colibri_free_text(char* text);

/* ========================================================================= */
/* Generation                                                                 */
/* ========================================================================= */

/* Receives generated UTF-8 text as soon as it is complete (`text` is not
 * NUL-terminated; `len` bytes). Return nonzero to go on, 0 to stop: the
 * result then has finish_reason COLIBRI_FINISH_CANCELLED. Runs on the thread
 * that called colibri_inference, before it returns. While a model has an
 * expert cache, an inference drives its store until it returns: from the
 * callback, colibri_inference* and colibri_model_enable_expert_cache on the
 * same model fail with COLIBRI_ERR_UNSUPPORTED (other models are fine). */
typedef int (*colibri_text_callback)(const char* text, size_t len, void* user_data);

typedef struct colibri_inference_params {
  size_t struct_size;          /* sizeof(colibri_inference_params) */
  int32_t max_tokens;          /* tokens to generate, >= 0. Default 128. */
  int32_t n_ctx;               /* context positions (prompt + generated); 0 = the
                                  model's maximum capped at 4096 (default);
                                  at most colibri_model_stats.max_positions. */
  /* Sampling, in the engine's order: penalties, top_k, top_p, min_p,
   * temperature, seeded draw. The defaults are greedy decoding. */
  float temperature;           /* >= 0, 0 = greedy (argmax, ties to the lowest id). Default 0. */
  int32_t top_k;               /* >= 0, 0 = off. Default 0. */
  float top_p;                 /* (0, 1], 1 = off. Default 1. */
  float min_p;                 /* [0, 1], 0 = off. Default 0. */
  float repetition_penalty;    /* > 0, 1 = off. Default 1. */
  float presence_penalty;      /* [-2, 2], 0 = off. Default 0. */
  float frequency_penalty;     /* [-2, 2], 0 = off. Default 0. */
  int32_t penalty_last_n;      /* >= -1: history the penalties see (-1 = all). Default 64. */
  uint64_t seed;               /* random seed for sampling. Default 0. */
  int32_t ignore_eos;          /* 0 or 1: 1 = keep generating past end-of-sequence. Default 0. */
  int32_t add_special_tokens;  /* 0 or 1: text prompts get BOS/EOS as the tokenizer
                                  prescribes. Default 1. (Ignored by _tokens.) */
  int32_t parse_special;       /* 0 or 1: special-token text in a text prompt becomes
                                  control tokens. Default 0. (Ignored by _tokens.) */
  const char* const* stop;     /* n_stop NUL-terminated stop strings (may be NULL when
                                  n_stop is 0); generation ends when one appears and
                                  the text stops before it. Default none. */
  size_t n_stop;
  colibri_text_callback on_text; /* optional streaming callback. Default NULL. */
  void* user_data;               /* passed to on_text */
  /* Fields below were added after the first release; a struct_size that ends
   * at logit_bias_tokens (an older colibri.h) is accepted and gets their defaults. */
  const int32_t* logit_bias_tokens; /* n_logit_bias token ids, each in [0, vocab) */
  const float* logit_bias_values;   /* their biases, each in [-100, 100], added to the
                                       logits before the penalties (-100 all but bans a
                                       token, +100 all but forces it). Default none. */
  size_t n_logit_bias;              /* at most 1024 */
  int32_t logprobs;                 /* -1 (default): none. 0..20: the result carries each
                                       generated token's log-probability under the model's
                                       own distribution (raw logits: before logit_bias,
                                       penalties and temperature) and this many most
                                       likely alternatives per token. */
  int32_t json_object;              /* 0 or 1: constrain the output to one JSON object;
                                       generation ends (COLIBRI_FINISH_JSON_COMPLETE) when
                                       it closes. Default 0. */
  /* Added after json_object; a struct_size that ends at exact_prompt is accepted
   * and gets its default. */
  int32_t exact_prompt;             /* 0 or 1. 0 (default): with 8-bit weights the prompt's
                                       FFN gate and up products take one int8 activation
                                       plane (faster prompts; fidelity within the int8
                                       bounds, docs/KERNELS.md "Prefill modes"), as
                                       colibri-run and the server by default. 1: the prompt
                                       is multiplied as generated tokens are, so its logits
                                       are bit-identical to decoding it token by token. */
} colibri_inference_params;

/* struct_size set, every field at its default (greedy, 128 tokens). */
COLIBRI_API colibri_inference_params colibri_inference_params_default(void);

typedef enum colibri_finish_reason {
  COLIBRI_FINISH_LENGTH = 0,       /* max_tokens generated */
  COLIBRI_FINISH_EOS = 1,          /* the model produced end-of-sequence (not in tokens) */
  COLIBRI_FINISH_STOP = 2,         /* a stop string appeared */
  COLIBRI_FINISH_CONTEXT_FULL = 3, /* no room for another position */
  COLIBRI_FINISH_CANCELLED = 4,    /* on_text returned 0 */
  COLIBRI_FINISH_JSON_COMPLETE = 5 /* params->json_object: the JSON object closed */
} colibri_finish_reason;

/* "length", "eos", "stop", "context_full", "cancelled", "json_complete"; "unknown" otherwise. */
COLIBRI_API const char* colibri_finish_reason_name(colibri_finish_reason reason);

/* One alternative at a generated position. */
typedef struct colibri_top_logprob {
  int32_t token;  /* -1 pads a row when the vocabulary has fewer candidates */
  float logprob;  /* natural log; -INFINITY for a masked token and for padding */
} colibri_top_logprob;

typedef struct colibri_result {
  int32_t* tokens;         /* n_tokens generated ids (owned by the result) */
  size_t n_tokens;
  char* text;              /* the generated text, NUL-terminated UTF-8 (owned by
                              the result); a stop string is not included */
  size_t text_len;         /* bytes before the NUL */
  size_t n_prompt_tokens;  /* prompt tokens fed to the model */
  int32_t finish_reason;   /* a colibri_finish_reason */
  /* With params->logprobs >= 0 (else NULL and 0), owned by the result: */
  float* token_logprobs;              /* n_tokens: log p(tokens[i]) */
  colibri_top_logprob* top_logprobs;  /* n_tokens rows of n_top_logprobs, most likely
                                         first (NULL when n_top_logprobs is 0) */
  int32_t n_top_logprobs;             /* params->logprobs */
} colibri_result;

/* Tokenizes the NUL-terminated UTF-8 `prompt` and generates from it in a fresh
 * context. `params` may be NULL (defaults). On success *out is a new result
 * (free it with colibri_free_result).
 * Errors: NULL_POINTER (model, prompt, out, stop strings), INVALID_ARGUMENT
 * (struct_size, sampling parameters, max_tokens < 0, n_ctx < 0, non-0/1
 * booleans, invalid UTF-8, a prompt with no tokens), OUT_OF_RANGE (n_ctx above
 * the model's maximum), CONTEXT_FULL (prompt longer than n_ctx), OUT_OF_MEMORY,
 * INTERNAL. */
COLIBRI_API colibri_status colibri_inference(const colibri_model* model, const char* prompt,
                                             const colibri_inference_params* params, colibri_result** out);

/* The same from prompt token ids (n_prompt >= 1, each in [0, vocab);
 * an id outside is OUT_OF_RANGE). */
COLIBRI_API colibri_status colibri_inference_tokens(const colibri_model* model, const int32_t* prompt,
                                                    size_t n_prompt, const colibri_inference_params* params,
                                                    colibri_result** out);

/* Releases a result, its tokens and its text. NULL is a no-op. */
COLIBRI_API void colibri_free_result(colibri_result* result);

/* ========================================================================= */
/* Routing                                                                    */
/* ========================================================================= */
/* Expert selection from gate (router) logits, the engine's own router: softmax
 * over all experts, the top_k experts by probability in descending order (ties
 * go to the lower expert index), weights = their probabilities, optionally
 * renormalised to sum to 1 over the k chosen. Routing never allocates. */

#define COLIBRI_MAX_EXPERTS 65536

typedef struct colibri_router colibri_router;

typedef struct colibri_router_config {
  size_t struct_size;   /* sizeof(colibri_router_config) */
  int32_t num_experts;  /* [1, COLIBRI_MAX_EXPERTS]; no default (0) */
  int32_t top_k;        /* [1, num_experts]; no default (0) */
  int32_t normalize;    /* 0 or 1: renormalise the top_k weights to sum to 1
                           (Mixtral, Qwen3-MoE); 0 keeps the softmax
                           probabilities (Qwen2-MoE, OLMoE). Default 0. */
} colibri_router_config;

/* struct_size set, normalize 0, num_experts and top_k 0 (must be set). */
COLIBRI_API colibri_router_config colibri_router_config_default(void);

/* A router over `num_experts` experts choosing `top_k`, not renormalised.
 * Errors: NULL_POINTER (out), INVALID_ARGUMENT (num_experts < 1, top_k < 1,
 * top_k > num_experts), OUT_OF_RANGE (num_experts > COLIBRI_MAX_EXPERTS),
 * OUT_OF_MEMORY. */
COLIBRI_API colibri_status colibri_init(int32_t num_experts, int32_t top_k, colibri_router** out);

/* The same from a config (normalize flag). Errors as colibri_init, plus
 * NULL_POINTER (config) and INVALID_ARGUMENT (struct_size, normalize not 0/1). */
COLIBRI_API colibri_status colibri_init_with_config(const colibri_router_config* config, colibri_router** out);

/* The router's configuration into *out (whose struct_size the caller set). */
COLIBRI_API colibri_status colibri_router_get_config(const colibri_router* router, colibri_router_config* out);

/* Routes one token: `gate_logits` holds num_experts floats; `experts_out` and
 * `weights_out` receive top_k values each.
 * Errors: NULL_POINTER, INVALID_ARGUMENT (a NaN or infinite logit; the
 * message names the expert). */
COLIBRI_API colibri_status colibri_route_experts(colibri_router* router, const float* gate_logits,
                                                 int32_t* experts_out, float* weights_out);

/* Routes `n_tokens` tokens: `logits` is row-major [n_tokens][num_experts];
 * `experts_out` and `weights_out` are row-major [n_tokens][top_k]. n_tokens 0
 * does nothing (pointers must still be non-NULL).
 * Errors: NULL_POINTER, INVALID_ARGUMENT (a NaN or infinite logit; the message
 * names the token and the expert; earlier rows are written, later ones are
 * unspecified), OUT_OF_RANGE (n_tokens * num_experts overflows size_t). */
COLIBRI_API colibri_status colibri_route_batch_experts(colibri_router* router, const float* logits,
                                                       size_t n_tokens, int32_t* experts_out, float* weights_out);

typedef enum colibri_cache_policy {
  COLIBRI_CACHE_LRU = 0,
  COLIBRI_CACHE_LFU = 1,
  COLIBRI_CACHE_FIFO = 2
} colibri_cache_policy;

/* A router is a stand-alone routing function with no experts to cache: a
 * valid policy returns COLIBRI_ERR_UNSUPPORTED (the message points to
 * colibri_model_set_cache_policy) and changes nothing; a value outside the
 * enum is INVALID_ARGUMENT, a NULL router NULL_POINTER. */
COLIBRI_API colibri_status colibri_set_cache_policy(colibri_router* router, colibri_cache_policy policy);

/* Chooses how the model's expert store evicts experts, from its next
 * eviction on (any thread, also while inferences run). COLIBRI_OK; a model
 * without a store (colibri_model_enable_expert_cache) is UNSUPPORTED and nothing
 * changes; a value outside the enum is INVALID_ARGUMENT, a NULL model
 * NULL_POINTER. */
COLIBRI_API colibri_status colibri_model_set_cache_policy(colibri_model* model, colibri_cache_policy policy);

/* Releases a router. NULL is a no-op. */
COLIBRI_API void colibri_free(colibri_router* router);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* COLIBRI_COLIBRI_H */

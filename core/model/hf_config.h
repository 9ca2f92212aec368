/*
 * hf_config.h - the Hugging Face `config.json` of a Qwen2 model (internal; not part of the ABI).
 *
 * Only what fp4rl's Qwen2 model needs is kept. The parser trusts nothing: each field must have the
 * right JSON type, integers must be integral and within the bounds below (so that no size computed
 * from them can overflow), the head counts must divide evenly, and the model must be a plain
 * Qwen2ForCausalLM. Errors follow the library's convention (a status and the thread's message):
 *   FP4RL_ERR_CORRUPT      not JSON, a field missing, of the wrong type or out of bounds, a key
 *                          that appears twice (the message names the field);
 *   FP4RL_ERR_UNSUPPORTED  valid, but another model (model_type, architectures) or a feature fp4rl
 *                          does not implement (rope_scaling, sliding windows, another activation);
 *   FP4RL_ERR_IO           (load only) the file cannot be read.
 */
#ifndef FP4RL_HF_CONFIG_H
#define FP4RL_HF_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Upper bounds of the integer fields (inclusive). Products of any two stay far below 2^53. */
#define FP4RL_HF_MAX_VOCAB        (1 << 22)
#define FP4RL_HF_MAX_HIDDEN       (1 << 16)
#define FP4RL_HF_MAX_INTERMEDIATE (1 << 18)
#define FP4RL_HF_MAX_LAYERS       1024
#define FP4RL_HF_MAX_HEADS        1024
#define FP4RL_HF_MAX_POSITIONS    (1 << 24)
/* Most end-of-sequence ids kept ("eos_token_id" may be one id or a list). */
#define FP4RL_HF_MAX_EOS          8

typedef struct fp4rl_hf_config {
    int64_t vocab_size;              /* required, 1..FP4RL_HF_MAX_VOCAB */
    int64_t hidden_size;             /* required, 1..FP4RL_HF_MAX_HIDDEN, divisible by the heads */
    int64_t intermediate_size;       /* required, 1..FP4RL_HF_MAX_INTERMEDIATE */
    int64_t num_hidden_layers;       /* required, 1..FP4RL_HF_MAX_LAYERS */
    int64_t num_attention_heads;     /* required, 1..FP4RL_HF_MAX_HEADS */
    int64_t num_key_value_heads;     /* default num_attention_heads; divides it */
    int64_t max_position_embeddings; /* required, 1..FP4RL_HF_MAX_POSITIONS */
    int64_t head_dim;                /* derived: hidden_size / num_attention_heads, must be even */
    double rope_theta;               /* default 10000; finite, > 0 */
    double rms_norm_eps;             /* default 1e-6; finite, in (0, 1) */
    int tie_word_embeddings;         /* default 0 */
    int64_t bos_token_id;            /* -1 when absent or null; else 0..vocab_size-1 */
    int n_eos;                       /* 0..FP4RL_HF_MAX_EOS */
    int64_t eos_token_id[FP4RL_HF_MAX_EOS];
} fp4rl_hf_config;

/* Parses `len` bytes of config.json text (need not be NUL-terminated) into *out (untouched on
 * error). Fields fp4rl does not use are ignored, except those that would change the model:
 *   model_type           required, "qwen2";
 *   architectures        if present, ["Qwen2ForCausalLM"];
 *   hidden_act           if present, "silu";
 *   head_dim             if present, hidden_size / num_attention_heads;
 *   rope_scaling         if present, null;
 *   use_sliding_window   if present, false;
 *   layer_types          if present, every entry "full_attention";
 *   attention_dropout    if present, 0.
 * Keys must not repeat at the top level (JSON readers disagree about which copy wins). */
FP4RL_HIDDEN fp4rl_status fp4rl_hf_config_parse(fp4rl_hf_config *out, const char *text, size_t len);
/* Reads and parses the file at `path` (at most 16 MiB). */
FP4RL_HIDDEN fp4rl_status fp4rl_hf_config_load(fp4rl_hf_config *out, const char *path);
/* Checks a filled-in struct by the same rules (head_dim included), e.g. before writing it. */
FP4RL_HIDDEN fp4rl_status fp4rl_hf_config_validate(const fp4rl_hf_config *cfg);
/* Writes cfg as config.json text that Hugging Face transformers loads as a Qwen2ForCausalLM and
 * that fp4rl_hf_config_parse reads back to an identical struct (doubles exactly). *out is a new
 * NUL-terminated malloc'd string; the caller frees it with free(). Validates cfg first. */
FP4RL_HIDDEN fp4rl_status fp4rl_hf_config_to_json(const fp4rl_hf_config *cfg, char **out);

#ifdef __cplusplus
}
#endif
#endif

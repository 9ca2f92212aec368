/*
 * fuzz_hf_config.c - the config.json parser (core/model/hf_config.h) on arbitrary bytes.
 *
 * The text is copied into a buffer of exactly its size with no NUL after it (the parser takes a
 * length, so it must not read past it). An accepted config must pass validation and survive a
 * round trip through fp4rl_hf_config_to_json to an identical struct, as the header promises.
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "model/hf_config.h"

/* Field by field: padding and eos entries past n_eos carry no meaning. Doubles compare as bits. */
static int same(const fp4rl_hf_config *a, const fp4rl_hf_config *b)
{
    if (a->vocab_size != b->vocab_size || a->hidden_size != b->hidden_size ||
        a->intermediate_size != b->intermediate_size || a->num_hidden_layers != b->num_hidden_layers ||
        a->num_attention_heads != b->num_attention_heads || a->num_key_value_heads != b->num_key_value_heads ||
        a->max_position_embeddings != b->max_position_embeddings || a->head_dim != b->head_dim ||
        memcmp(&a->rope_theta, &b->rope_theta, sizeof a->rope_theta) != 0 ||
        memcmp(&a->rms_norm_eps, &b->rms_norm_eps, sizeof a->rms_norm_eps) != 0 ||
        a->tie_word_embeddings != b->tie_word_embeddings || a->bos_token_id != b->bos_token_id || a->n_eos != b->n_eos)
        return 0;
    for (int i = 0; i < a->n_eos; i++)
        if (a->eos_token_id[i] != b->eos_token_id[i]) return 0;
    return 1;
}

int fp4rl_fuzz_hf_config(const uint8_t *data, size_t size)
{
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    fp4rl_hf_config cfg, back;
    fp4rl_fuzz_accepted = fp4rl_hf_config_parse(&cfg, text, size) == FP4RL_OK;
    if (fp4rl_fuzz_accepted) {
        if (fp4rl_hf_config_validate(&cfg) != FP4RL_OK) abort();
        char *json = NULL;
        if (fp4rl_hf_config_to_json(&cfg, &json) != FP4RL_OK) abort();
        if (fp4rl_hf_config_parse(&back, json, strlen(json)) != FP4RL_OK) abort();
        if (!same(&cfg, &back)) abort();
        free(json);
    }
    free(text);
    return 0;
}

FP4RL_FUZZ_ENTRY(fp4rl_fuzz_hf_config)

/*
 * test_hf_config.c - the Qwen2 config.json parser and writer (core/model/hf_config.h): real and minimal
 * configs, defaults, GQA and tied embeddings, the round trip through the writer, and every way a
 * config can be wrong (each must give its status and a message naming the field).
 */
#define _POSIX_C_SOURCE 200809L
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/hf_config.h"

#define EXPECT FP4RL_EXPECT /* check_run.h */

/* Qwen2.5-0.5B-Instruct's config.json, as published. */
static const char *QWEN25_05B =
    "{\n"
    "  \"architectures\": [\n    \"Qwen2ForCausalLM\"\n  ],\n"
    "  \"attention_dropout\": 0.0,\n"
    "  \"bos_token_id\": 151643,\n"
    "  \"eos_token_id\": 151645,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 896,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"intermediate_size\": 4864,\n"
    "  \"max_position_embeddings\": 32768,\n"
    "  \"max_window_layers\": 21,\n"
    "  \"model_type\": \"qwen2\",\n"
    "  \"num_attention_heads\": 14,\n"
    "  \"num_hidden_layers\": 24,\n"
    "  \"num_key_value_heads\": 2,\n"
    "  \"rms_norm_eps\": 1e-06,\n"
    "  \"rope_scaling\": null,\n"
    "  \"rope_theta\": 1000000.0,\n"
    "  \"sliding_window\": 32768,\n"
    "  \"tie_word_embeddings\": true,\n"
    "  \"torch_dtype\": \"bfloat16\",\n"
    "  \"transformers_version\": \"4.43.1\",\n"
    "  \"use_cache\": true,\n"
    "  \"use_sliding_window\": false,\n"
    "  \"vocab_size\": 151936\n"
    "}\n";

static fp4rl_status parse_str(fp4rl_hf_config *c, const char *s) { return fp4rl_hf_config_parse(c, s, strlen(s)); }

START_TEST(test_real_config)
{
    fp4rl_hf_config c;
    EXPECT(parse_str(&c, QWEN25_05B), FP4RL_OK);
    ck_assert_int_eq(c.vocab_size, 151936);
    ck_assert_int_eq(c.hidden_size, 896);
    ck_assert_int_eq(c.intermediate_size, 4864);
    ck_assert_int_eq(c.num_hidden_layers, 24);
    ck_assert_int_eq(c.num_attention_heads, 14);
    ck_assert_int_eq(c.num_key_value_heads, 2); /* GQA: 7 query heads per kv head */
    ck_assert_int_eq(c.head_dim, 64);
    ck_assert_int_eq(c.max_position_embeddings, 32768);
    ck_assert(c.rope_theta == 1000000.0);
    ck_assert(c.rms_norm_eps == 1e-6);
    ck_assert_int_eq(c.tie_word_embeddings, 1);
    ck_assert_int_eq(c.bos_token_id, 151643);
    ck_assert_int_eq(c.n_eos, 1);
    ck_assert_int_eq(c.eos_token_id[0], 151645);
}
END_TEST

/* A small config as key/value pairs, so that cases can replace, add or remove one field. */
static const char *BASE[][2] = {
    {"architectures", "[\"Qwen2ForCausalLM\"]"},
    {"model_type", "\"qwen2\""},
    {"vocab_size", "256"},
    {"hidden_size", "64"},
    {"intermediate_size", "128"},
    {"num_hidden_layers", "2"},
    {"num_attention_heads", "4"},
    {"max_position_embeddings", "512"},
};
#define NBASE (sizeof BASE / sizeof BASE[0])

/* The base config with `key` set to `value` (added when absent; removed when value is NULL). */
static char *cfg_with(const char *key, const char *value)
{
    static char buf[8192];
    size_t o = 0;
    int found = 0;
    o += (size_t)snprintf(buf + o, sizeof buf - o, "{");
    for (size_t i = 0; i < NBASE; i++) {
        const char *v = BASE[i][1];
        if (key && strcmp(key, BASE[i][0]) == 0) {
            found = 1;
            if (!value) continue;
            v = value;
        }
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s\"%s\": %s", o > 1 ? ", " : "", BASE[i][0], v);
    }
    if (key && !found && value) o += (size_t)snprintf(buf + o, sizeof buf - o, ", \"%s\": %s", key, value);
    snprintf(buf + o, sizeof buf - o, "}");
    return buf;
}

START_TEST(test_minimal_and_defaults)
{
    fp4rl_hf_config c;
    EXPECT(parse_str(&c, cfg_with(NULL, NULL)), FP4RL_OK);
    ck_assert_int_eq(c.num_key_value_heads, 4); /* default: MHA */
    ck_assert_int_eq(c.head_dim, 16);
    ck_assert(c.rope_theta == 10000.0);
    ck_assert(c.rms_norm_eps == 1e-6);
    ck_assert_int_eq(c.tie_word_embeddings, 0);
    ck_assert_int_eq(c.bos_token_id, -1);
    ck_assert_int_eq(c.n_eos, 0);
    /* architectures is optional; null means the default for every optional field */
    EXPECT(parse_str(&c, cfg_with("architectures", NULL)), FP4RL_OK);
    const char *nulls[] = {"num_key_value_heads", "rope_theta", "rms_norm_eps", "tie_word_embeddings", "bos_token_id",
                           "eos_token_id", "head_dim", "rope_scaling", "use_sliding_window", "layer_types",
                           "attention_dropout", "architectures", "hidden_act"};
    for (size_t i = 0; i < sizeof nulls / sizeof nulls[0]; i++) {
        EXPECT(parse_str(&c, cfg_with(nulls[i], "null")), FP4RL_OK);
        ck_assert_int_eq(c.num_key_value_heads, 4);
        ck_assert(c.rope_theta == 10000.0);
    }
    /* the optional fields, set */
    EXPECT(parse_str(&c, cfg_with("num_key_value_heads", "1")), FP4RL_OK); /* MQA */
    ck_assert_int_eq(c.num_key_value_heads, 1);
    EXPECT(parse_str(&c, cfg_with("tie_word_embeddings", "true")), FP4RL_OK);
    ck_assert_int_eq(c.tie_word_embeddings, 1);
    EXPECT(parse_str(&c, cfg_with("rope_theta", "500000")), FP4RL_OK);
    ck_assert(c.rope_theta == 500000.0);
    EXPECT(parse_str(&c, cfg_with("rms_norm_eps", "1e-5")), FP4RL_OK);
    ck_assert(c.rms_norm_eps == 1e-5);
    EXPECT(parse_str(&c, cfg_with("eos_token_id", "[3, 7, 255]")), FP4RL_OK);
    ck_assert_int_eq(c.n_eos, 3);
    ck_assert_int_eq(c.eos_token_id[2], 255);
    EXPECT(parse_str(&c, cfg_with("eos_token_id", "[]")), FP4RL_OK);
    ck_assert_int_eq(c.n_eos, 0);
    EXPECT(parse_str(&c, cfg_with("head_dim", "16")), FP4RL_OK);
    EXPECT(parse_str(&c, cfg_with("hidden_act", "\"silu\"")), FP4RL_OK);
    EXPECT(parse_str(&c, cfg_with("use_sliding_window", "false")), FP4RL_OK);
    EXPECT(parse_str(&c, cfg_with("layer_types", "[\"full_attention\", \"full_attention\"]")), FP4RL_OK);
    EXPECT(parse_str(&c, cfg_with("attention_dropout", "0")), FP4RL_OK);
    EXPECT(parse_str(&c, cfg_with("architectures", "[]")), FP4RL_OK);
    EXPECT(parse_str(&c, cfg_with("hidden_size", "64.0")), FP4RL_OK); /* integral, though spelled as a float */
    ck_assert_int_eq(c.hidden_size, 64);
    /* metadata that cannot change the math is accepted */
    EXPECT(parse_str(&c, cfg_with("dtype", "\"bfloat16\"")), FP4RL_OK);
    EXPECT(parse_str(&c, cfg_with("pad_token_id", "null")), FP4RL_OK);
    /* the upper bounds themselves are accepted */
    char big[32];
    snprintf(big, sizeof big, "%d", FP4RL_HF_MAX_VOCAB);
    EXPECT(parse_str(&c, cfg_with("vocab_size", big)), FP4RL_OK);
}
END_TEST

static void expect_fail(const char *text, fp4rl_status want, const char *substr)
{
    fp4rl_hf_config c;
    memset(&c, 0xab, sizeof c);
    fp4rl_hf_config before = c;
    fp4rl_status st = fp4rl_hf_config_parse(&c, text, strlen(text));
    ck_assert_msg(st == want, "%s: got %s, want %s (%s)", text, fp4rl_status_name(st), fp4rl_status_name(want), fp4rl_last_error());
    ck_assert_msg(strstr(fp4rl_last_error(), substr), "%s: message '%s' lacks '%s'", text, fp4rl_last_error(), substr);
    ck_assert_msg(memcmp(&c, &before, sizeof c) == 0, "%s: output changed on error", text);
}

START_TEST(test_required_fields)
{
    for (size_t i = 0; i < NBASE; i++) {
        if (strcmp(BASE[i][0], "architectures") == 0) continue;
        expect_fail(cfg_with(BASE[i][0], NULL), FP4RL_ERR_CORRUPT, BASE[i][0]);
        expect_fail(cfg_with(BASE[i][0], "null"), FP4RL_ERR_CORRUPT, BASE[i][0]);
    }
}
END_TEST

START_TEST(test_bad_integers)
{
    const char *ints[] = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "max_position_embeddings"};
    const char *bad[] = {"0", "-4", "64.5", "\"64\"", "true", "[64]", "{}", "1e300", "-1e300", "1e400", "9007199254740993",
                         "16777217000"};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) expect_fail(cfg_with(ints[i], bad[j]), FP4RL_ERR_CORRUPT, ints[i]);
    /* just above each bound */
    char v[32];
    snprintf(v, sizeof v, "%d", FP4RL_HF_MAX_VOCAB + 1);
    expect_fail(cfg_with("vocab_size", v), FP4RL_ERR_CORRUPT, "vocab_size");
    snprintf(v, sizeof v, "%d", FP4RL_HF_MAX_INTERMEDIATE + 1);
    expect_fail(cfg_with("intermediate_size", v), FP4RL_ERR_CORRUPT, "intermediate_size");
    snprintf(v, sizeof v, "%d", FP4RL_HF_MAX_LAYERS + 1);
    expect_fail(cfg_with("num_hidden_layers", v), FP4RL_ERR_CORRUPT, "num_hidden_layers");
    snprintf(v, sizeof v, "%d", FP4RL_HF_MAX_POSITIONS + 1);
    expect_fail(cfg_with("max_position_embeddings", v), FP4RL_ERR_CORRUPT, "max_position_embeddings");
    expect_fail(cfg_with("hidden_size", "131072"), FP4RL_ERR_CORRUPT, "hidden_size");
    expect_fail(cfg_with("num_attention_heads", "2048"), FP4RL_ERR_CORRUPT, "num_attention_heads");
}
END_TEST

START_TEST(test_shape_rules)
{
    expect_fail(cfg_with("num_attention_heads", "5"), FP4RL_ERR_CORRUPT, "not divisible by \"num_attention_heads\"");
    expect_fail(cfg_with("num_key_value_heads", "3"), FP4RL_ERR_CORRUPT, "not divisible by \"num_key_value_heads\"");
    expect_fail(cfg_with("num_key_value_heads", "8"), FP4RL_ERR_CORRUPT, "num_key_value_heads"); /* more kv than q heads */
    expect_fail(cfg_with("hidden_size", "12"), FP4RL_ERR_CORRUPT, "odd");                        /* head dim 3 */
    expect_fail(cfg_with("head_dim", "32"), FP4RL_ERR_UNSUPPORTED, "head_dim");
    expect_fail(cfg_with("head_dim", "16.5"), FP4RL_ERR_CORRUPT, "head_dim");
    expect_fail(cfg_with("head_dim", "\"16\""), FP4RL_ERR_CORRUPT, "head_dim");
    expect_fail(cfg_with("rope_theta", "0"), FP4RL_ERR_CORRUPT, "rope_theta");
    expect_fail(cfg_with("rope_theta", "-10000"), FP4RL_ERR_CORRUPT, "rope_theta");
    expect_fail(cfg_with("rope_theta", "1e400"), FP4RL_ERR_CORRUPT, "rope_theta");
    expect_fail(cfg_with("rope_theta", "\"10000\""), FP4RL_ERR_CORRUPT, "rope_theta");
    expect_fail(cfg_with("rms_norm_eps", "0"), FP4RL_ERR_CORRUPT, "rms_norm_eps");
    expect_fail(cfg_with("rms_norm_eps", "-1e-6"), FP4RL_ERR_CORRUPT, "rms_norm_eps");
    expect_fail(cfg_with("rms_norm_eps", "1"), FP4RL_ERR_CORRUPT, "rms_norm_eps");
    expect_fail(cfg_with("rms_norm_eps", "[1e-6]"), FP4RL_ERR_CORRUPT, "rms_norm_eps");
    expect_fail(cfg_with("tie_word_embeddings", "1"), FP4RL_ERR_CORRUPT, "tie_word_embeddings");
    expect_fail(cfg_with("tie_word_embeddings", "\"true\""), FP4RL_ERR_CORRUPT, "tie_word_embeddings");
    expect_fail(cfg_with("bos_token_id", "256"), FP4RL_ERR_CORRUPT, "bos_token_id"); /* vocab is 256 */
    expect_fail(cfg_with("bos_token_id", "-2"), FP4RL_ERR_CORRUPT, "bos_token_id");
    expect_fail(cfg_with("eos_token_id", "-1"), FP4RL_ERR_CORRUPT, "eos_token_id");
    expect_fail(cfg_with("eos_token_id", "1000"), FP4RL_ERR_CORRUPT, "eos_token_id");
    expect_fail(cfg_with("eos_token_id", "[1, \"2\"]"), FP4RL_ERR_CORRUPT, "eos_token_id");
    expect_fail(cfg_with("eos_token_id", "[1, 2.5]"), FP4RL_ERR_CORRUPT, "eos_token_id");
    expect_fail(cfg_with("eos_token_id", "[1, 300]"), FP4RL_ERR_CORRUPT, "eos_token_id");
    expect_fail(cfg_with("eos_token_id", "[1,2,3,4,5,6,7,8,9]"), FP4RL_ERR_UNSUPPORTED, "eos_token_id");
    expect_fail(cfg_with("eos_token_id", "\"x\""), FP4RL_ERR_CORRUPT, "eos_token_id");
}
END_TEST

/* transformers 5 spells the RoPE base inside "rope_parameters"; everything not on the allow-list
 * is refused by name instead of being silently ignored. */
START_TEST(test_rope_parameters_and_allow_list)
{
    fp4rl_hf_config c;
    EXPECT(parse_str(&c, cfg_with("rope_parameters", "{\"rope_theta\": 1000000.0, \"rope_type\": \"default\"}")), FP4RL_OK);
    ck_assert(c.rope_theta == 1000000.0);
    EXPECT(parse_str(&c, cfg_with("rope_parameters", "{\"rope_type\": \"default\"}")), FP4RL_OK);
    ck_assert(c.rope_theta == 10000.0);
    EXPECT(parse_str(&c, cfg_with("rope_parameters", "null")), FP4RL_OK);
    expect_fail(cfg_with("rope_parameters", "{\"rope_theta\": 1000000.0, \"rope_type\": \"yarn\", \"factor\": 4.0}"),
                FP4RL_ERR_UNSUPPORTED, "rope_parameters");
    expect_fail(cfg_with("rope_parameters", "{\"rope_theta\": 1000000.0, \"rope_type\": \"yarn\"}"), FP4RL_ERR_UNSUPPORTED, "yarn");
    expect_fail(cfg_with("rope_parameters", "{\"rope_theta\": 1e6, \"partial_rotary_factor\": 0.5}"), FP4RL_ERR_UNSUPPORTED,
                "partial_rotary_factor");
    expect_fail(cfg_with("rope_parameters", "{\"rope_theta\": \"1e6\"}"), FP4RL_ERR_CORRUPT, "rope_theta");
    expect_fail(cfg_with("rope_parameters", "{\"rope_theta\": -1}"), FP4RL_ERR_CORRUPT, "rope_theta");
    expect_fail(cfg_with("rope_parameters", "[1]"), FP4RL_ERR_CORRUPT, "rope_parameters");
    /* both spellings: they must agree */
    char *two = cfg_with("rope_parameters", "{\"rope_theta\": 500000.0}");
    char *p = strstr(two, "\"rope_parameters\"");
    ck_assert_ptr_nonnull(p);
    size_t n = strlen(two);
    char *both = malloc(n + 64), *both2 = malloc(n + 64);
    snprintf(both, n + 64, "%.*s\"rope_theta\": 500000.0, %s", (int)(p - two), two, p);
    snprintf(both2, n + 64, "%.*s\"rope_theta\": 10000.0, %s", (int)(p - two), two, p);
    EXPECT(parse_str(&c, both), FP4RL_OK);
    ck_assert(c.rope_theta == 500000.0);
    expect_fail(both2, FP4RL_ERR_CORRUPT, "disagree");
    free(both);
    free(both2);
    /* unknown fields, enabled sliding windows, quantized checkpoints: refused by name */
    expect_fail(cfg_with("unknown_field", "{\"nested\": [1, 2, {\"x\": null}]}"), FP4RL_ERR_UNSUPPORTED, "unknown_field");
    expect_fail(cfg_with("quantization_config", "{\"quant_method\": \"gptq\"}"), FP4RL_ERR_UNSUPPORTED, "quantization_config");
    expect_fail(cfg_with("use_sliding_window", "true"), FP4RL_ERR_UNSUPPORTED, "use_sliding_window");
}
END_TEST

START_TEST(test_other_models_and_features)
{
    expect_fail(cfg_with("model_type", "\"llama\""), FP4RL_ERR_UNSUPPORTED, "llama");
    expect_fail(cfg_with("model_type", "\"qwen3\""), FP4RL_ERR_UNSUPPORTED, "qwen3");
    expect_fail(cfg_with("model_type", "\"Qwen2\""), FP4RL_ERR_UNSUPPORTED, "Qwen2"); /* case matters */
    expect_fail(cfg_with("model_type", "5"), FP4RL_ERR_CORRUPT, "model_type");
    expect_fail(cfg_with("model_type", "\"qwen2\\u0000x\""), FP4RL_ERR_CORRUPT, "\\u0000");
    expect_fail(cfg_with("architectures", "[\"LlamaForCausalLM\"]"), FP4RL_ERR_UNSUPPORTED, "LlamaForCausalLM");
    expect_fail(cfg_with("architectures", "[\"Qwen2ForCausalLM\", \"Qwen2ForSequenceClassification\"]"), FP4RL_ERR_UNSUPPORTED,
                "Qwen2ForSequenceClassification");
    expect_fail(cfg_with("architectures", "\"Qwen2ForCausalLM\""), FP4RL_ERR_CORRUPT, "architectures");
    expect_fail(cfg_with("architectures", "[5]"), FP4RL_ERR_CORRUPT, "architectures");
    /* another model is reported as such even when it lacks our fields */
    expect_fail("{\"model_type\": \"gpt2\", \"n_embd\": 768}", FP4RL_ERR_UNSUPPORTED, "gpt2");
    expect_fail(cfg_with("hidden_act", "\"gelu\""), FP4RL_ERR_UNSUPPORTED, "gelu");
    expect_fail(cfg_with("hidden_act", "7"), FP4RL_ERR_CORRUPT, "hidden_act");
    expect_fail(cfg_with("rope_scaling", "{\"type\": \"yarn\", \"factor\": 4.0}"), FP4RL_ERR_UNSUPPORTED, "rope_scaling");
    expect_fail(cfg_with("use_sliding_window", "true"), FP4RL_ERR_UNSUPPORTED, "use_sliding_window");
    expect_fail(cfg_with("use_sliding_window", "0"), FP4RL_ERR_CORRUPT, "use_sliding_window");
    expect_fail(cfg_with("layer_types", "[\"full_attention\", \"sliding_attention\"]"), FP4RL_ERR_UNSUPPORTED, "sliding_attention");
    expect_fail(cfg_with("layer_types", "[\"full_attention\"]"), FP4RL_ERR_CORRUPT, "layer_types");
    expect_fail(cfg_with("layer_types", "\"full_attention\""), FP4RL_ERR_CORRUPT, "layer_types");
    expect_fail(cfg_with("layer_types", "[1, 2]"), FP4RL_ERR_CORRUPT, "layer_types");
    expect_fail(cfg_with("attention_dropout", "0.1"), FP4RL_ERR_UNSUPPORTED, "attention_dropout");
    expect_fail(cfg_with("attention_dropout", "\"0\""), FP4RL_ERR_CORRUPT, "attention_dropout");
}
END_TEST

START_TEST(test_malformed_text)
{
    expect_fail("", FP4RL_ERR_CORRUPT, "JSON");
    expect_fail("   ", FP4RL_ERR_CORRUPT, "JSON");
    expect_fail("{\"vocab_size\": 5", FP4RL_ERR_CORRUPT, "JSON");
    expect_fail("[1, 2]", FP4RL_ERR_CORRUPT, "not an object");
    expect_fail("\"qwen2\"", FP4RL_ERR_CORRUPT, "not an object");
    expect_fail("null", FP4RL_ERR_CORRUPT, "not an object");
    expect_fail("{} {}", FP4RL_ERR_CORRUPT, "after");
    expect_fail("{}x", FP4RL_ERR_CORRUPT, "after");
    expect_fail("{\"a\": 1,}", FP4RL_ERR_CORRUPT, "JSON");
    expect_fail("{\"model_type\": \"qwen2\", \"model_type\": \"llama\"}", FP4RL_ERR_CORRUPT, "appears twice");
    char dup[8192];
    snprintf(dup, sizeof dup, "%.*s, \"vocab_size\": 512}", (int)strlen(cfg_with(NULL, NULL)) - 1, cfg_with(NULL, NULL));
    expect_fail(dup, FP4RL_ERR_CORRUPT, "vocab_size");
    expect_fail("{\"model_type\": \"qw\xffn2\"}", FP4RL_ERR_CORRUPT, "UTF-8");
    expect_fail("{\"model_type\": \"qwen2\x01\"}", FP4RL_ERR_CORRUPT, "control");
    /* deep nesting is rejected, not a stack overflow */
    size_t depth = 100000;
    char *deep = malloc(2 * depth + 64);
    size_t o = (size_t)sprintf(deep, "{\"x\": ");
    for (size_t i = 0; i < depth; i++) deep[o++] = '[';
    for (size_t i = 0; i < depth; i++) deep[o++] = ']';
    strcpy(deep + o, "}");
    expect_fail(deep, FP4RL_ERR_CORRUPT, "JSON");
    free(deep);
    /* the length is honoured: a valid config cut short is invalid, and bytes past len are never read */
    const char *ok = cfg_with(NULL, NULL);
    size_t n = strlen(ok);
    for (size_t cut = 0; cut < n; cut++) {
        char *p = malloc(cut ? cut : 1);
        memcpy(p, ok, cut);
        fp4rl_hf_config c;
        ck_assert_int_eq(fp4rl_hf_config_parse(&c, p, cut), FP4RL_ERR_CORRUPT);
        free(p);
    }
    fp4rl_hf_config c;
    EXPECT(fp4rl_hf_config_parse(NULL, ok, n), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_hf_config_parse(&c, NULL, 5), FP4RL_ERR_INVALID_ARGUMENT);
}
END_TEST

static void expect_same(const fp4rl_hf_config *a, const fp4rl_hf_config *b)
{
    ck_assert_int_eq(a->vocab_size, b->vocab_size);
    ck_assert_int_eq(a->hidden_size, b->hidden_size);
    ck_assert_int_eq(a->intermediate_size, b->intermediate_size);
    ck_assert_int_eq(a->num_hidden_layers, b->num_hidden_layers);
    ck_assert_int_eq(a->num_attention_heads, b->num_attention_heads);
    ck_assert_int_eq(a->num_key_value_heads, b->num_key_value_heads);
    ck_assert_int_eq(a->max_position_embeddings, b->max_position_embeddings);
    ck_assert_int_eq(a->head_dim, b->head_dim);
    ck_assert_msg(memcmp(&a->rope_theta, &b->rope_theta, sizeof(double)) == 0, "rope_theta %.17g vs %.17g", a->rope_theta, b->rope_theta);
    ck_assert_msg(memcmp(&a->rms_norm_eps, &b->rms_norm_eps, sizeof(double)) == 0, "eps %.17g vs %.17g", a->rms_norm_eps, b->rms_norm_eps);
    ck_assert_int_eq(a->tie_word_embeddings, b->tie_word_embeddings);
    ck_assert_int_eq(a->bos_token_id, b->bos_token_id);
    ck_assert_int_eq(a->n_eos, b->n_eos);
    for (int i = 0; i < a->n_eos; i++) ck_assert_int_eq(a->eos_token_id[i], b->eos_token_id[i]);
}

START_TEST(test_roundtrip)
{
    fp4rl_hf_config c, back;
    EXPECT(parse_str(&c, QWEN25_05B), FP4RL_OK);
    char *text = NULL;
    EXPECT(fp4rl_hf_config_to_json(&c, &text), FP4RL_OK);
    ck_assert_ptr_nonnull(strstr(text, "\"Qwen2ForCausalLM\""));
    ck_assert_ptr_nonnull(strstr(text, "\"qwen2\""));
    ck_assert_ptr_nonnull(strstr(text, "1000000.0")); /* a float stays a float for Python */
    EXPECT(parse_str(&back, text), FP4RL_OK);
    expect_same(&c, &back);
    free(text);

    /* doubles that need 17 digits, several eos ids, no bos, untied */
    EXPECT(parse_str(&c, cfg_with(NULL, NULL)), FP4RL_OK);
    c.rope_theta = 0.1 + 0.2;
    c.rms_norm_eps = 1.0 / 3.0 * 1e-5;
    c.n_eos = 3;
    c.eos_token_id[0] = 0, c.eos_token_id[1] = 7, c.eos_token_id[2] = 255;
    c.num_key_value_heads = 2;
    EXPECT(fp4rl_hf_config_to_json(&c, &text), FP4RL_OK);
    EXPECT(parse_str(&back, text), FP4RL_OK);
    expect_same(&c, &back);
    ck_assert_ptr_null(strstr(text, "bos_token_id"));
    free(text);

    /* the writer validates: an inconsistent struct is refused */
    fp4rl_hf_config bad = c;
    bad.head_dim = 8;
    text = NULL;
    EXPECT(fp4rl_hf_config_to_json(&bad, &text), FP4RL_ERR_CORRUPT);
    ck_assert_ptr_null(text);
    bad = c;
    bad.num_key_value_heads = 3;
    EXPECT(fp4rl_hf_config_validate(&bad), FP4RL_ERR_CORRUPT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "num_key_value_heads"));
    bad = c;
    bad.rms_norm_eps = NAN;
    EXPECT(fp4rl_hf_config_to_json(&bad, &text), FP4RL_ERR_CORRUPT);
    EXPECT(fp4rl_hf_config_validate(&c), FP4RL_OK);
    EXPECT(fp4rl_hf_config_validate(NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_hf_config_to_json(NULL, &text), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_hf_config_to_json(&c, NULL), FP4RL_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_load)
{
    char dir[] = "/tmp/fp4rl_hfcfg_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(QWEN25_05B, f);
    fclose(f);
    fp4rl_hf_config c;
    EXPECT(fp4rl_hf_config_load(&c, path), FP4RL_OK);
    ck_assert_int_eq(c.hidden_size, 896);
    char missing[300];
    snprintf(missing, sizeof missing, "%s/nope.json", dir);
    EXPECT(fp4rl_hf_config_load(&c, missing), FP4RL_ERR_IO);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "nope.json"));
    EXPECT(fp4rl_hf_config_load(&c, dir), FP4RL_ERR_IO); /* a directory */
    f = fopen(path, "wb");
    fclose(f);
    EXPECT(fp4rl_hf_config_load(&c, path), FP4RL_ERR_CORRUPT); /* empty file */
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "config.json"));
    EXPECT(fp4rl_hf_config_load(NULL, path), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_hf_config_load(&c, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    unlink(path);
    rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("hf_config");
    TCase *tc = tcase_create("hf_config");
    tcase_add_test(tc, test_real_config);
    tcase_add_test(tc, test_minimal_and_defaults);
    tcase_add_test(tc, test_required_fields);
    tcase_add_test(tc, test_bad_integers);
    tcase_add_test(tc, test_shape_rules);
    tcase_add_test(tc, test_other_models_and_features);
    tcase_add_test(tc, test_rope_parameters_and_allow_list);
    tcase_add_test(tc, test_malformed_text);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_load);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}

/* hf_config.c - the Qwen2 config.json: a strict parser and a writer (see hf_config.h). */
#include <locale.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/hf_config.h"
#include "io/json.h"
#include "io/safetensors.h" /* fp4rl_read_file, fp4rl_utf8_valid */

#define HF_MAX_FILE ((size_t)16 << 20)
#define HF_MAX_EXACT 9007199254740992.0 /* 2^53 */

/* The field, or NULL when it is absent or JSON null (both mean "use the default"). */
static const cJSON *field(const cJSON *root, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsNull(j) ? NULL : j;
}

/* An integral number with |v| <= 2^53 into *v. Absent: *v = dflt when !required, else an error. */
static fp4rl_status get_int(const cJSON *root, const char *key, bool required, int64_t dflt, int64_t *v, const char *src)
{
    const cJSON *j = field(root, key);
    if (!j) {
        if (required) return fp4rl_fail(FP4RL_ERR_CORRUPT, "fp4rl_hf_config_parse: %s: \"%s\" is missing", src, key);
        *v = dflt;
        return FP4RL_OK;
    }
    if (!cJSON_IsNumber(j))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "fp4rl_hf_config_parse: %s: \"%s\" is a JSON %s, not an integer", src, key, fp4rl_json_type(j));
    double d = j->valuedouble;
    if (!(fabs(d) <= HF_MAX_EXACT) || d != floor(d))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "fp4rl_hf_config_parse: %s: \"%s\" is %.17g, not an integer in range", src, key, d);
    *v = (int64_t)d;
    return FP4RL_OK;
}

static fp4rl_status get_double(const cJSON *root, const char *key, double dflt, double *v, const char *src)
{
    const cJSON *j = field(root, key);
    if (!j) {
        *v = dflt;
        return FP4RL_OK;
    }
    if (!cJSON_IsNumber(j))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "fp4rl_hf_config_parse: %s: \"%s\" is a JSON %s, not a number", src, key, fp4rl_json_type(j));
    *v = j->valuedouble;
    return FP4RL_OK;
}

static fp4rl_status get_bool(const cJSON *root, const char *key, int dflt, int *v, const char *src)
{
    const cJSON *j = field(root, key);
    if (!j) {
        *v = dflt;
        return FP4RL_OK;
    }
    if (!cJSON_IsBool(j))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "fp4rl_hf_config_parse: %s: \"%s\" is a JSON %s, not true or false", src, key, fp4rl_json_type(j));
    *v = cJSON_IsTrue(j);
    return FP4RL_OK;
}

/* An optional string field that must equal `want` when present. */
static fp4rl_status want_string(const cJSON *root, const char *key, const char *want, bool required, const char *src)
{
    const cJSON *j = field(root, key);
    if (!j) {
        if (required) return fp4rl_fail(FP4RL_ERR_CORRUPT, "fp4rl_hf_config_parse: %s: \"%s\" is missing", src, key);
        return FP4RL_OK;
    }
    if (!cJSON_IsString(j))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "fp4rl_hf_config_parse: %s: \"%s\" is a JSON %s, not a string", src, key, fp4rl_json_type(j));
    if (strcmp(j->valuestring, want) != 0)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "fp4rl_hf_config_parse: %s: \"%s\" is \"%.100s\"; fp4rl implements \"%s\" only",
                          src, key, j->valuestring, want);
    return FP4RL_OK;
}

static bool in_range(int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; }

/* Every rule on the struct, with messages naming the field. */
static fp4rl_status check_cfg(const fp4rl_hf_config *c, const char *fn, const char *src)
{
    static const struct {
        const char *name;
        size_t off;
        int64_t hi;
    } ints[] = {
        {"vocab_size", offsetof(fp4rl_hf_config, vocab_size), FP4RL_HF_MAX_VOCAB},
        {"hidden_size", offsetof(fp4rl_hf_config, hidden_size), FP4RL_HF_MAX_HIDDEN},
        {"intermediate_size", offsetof(fp4rl_hf_config, intermediate_size), FP4RL_HF_MAX_INTERMEDIATE},
        {"num_hidden_layers", offsetof(fp4rl_hf_config, num_hidden_layers), FP4RL_HF_MAX_LAYERS},
        {"num_attention_heads", offsetof(fp4rl_hf_config, num_attention_heads), FP4RL_HF_MAX_HEADS},
        {"num_key_value_heads", offsetof(fp4rl_hf_config, num_key_value_heads), FP4RL_HF_MAX_HEADS},
        {"max_position_embeddings", offsetof(fp4rl_hf_config, max_position_embeddings), FP4RL_HF_MAX_POSITIONS},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        int64_t v;
        memcpy(&v, (const char *)c + ints[i].off, sizeof v);
        if (!in_range(v, 1, ints[i].hi))
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"%s\" is %lld; it must be an integer in [1, %lld]", fn, src, ints[i].name,
                              (long long)v, (long long)ints[i].hi);
    }
    if (c->hidden_size % c->num_attention_heads)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"hidden_size\" %lld is not divisible by \"num_attention_heads\" %lld", fn, src,
                          (long long)c->hidden_size, (long long)c->num_attention_heads);
    if (c->num_attention_heads % c->num_key_value_heads)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"num_attention_heads\" %lld is not divisible by \"num_key_value_heads\" %lld", fn,
                          src, (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
    int64_t hd = c->hidden_size / c->num_attention_heads;
    if (hd % 2)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: the head dim hidden_size / num_attention_heads = %lld is odd; rotary embeddings need it even",
                          fn, src, (long long)hd);
    if (c->head_dim != hd)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"head_dim\" is %lld; it must be hidden_size / num_attention_heads = %lld", fn, src,
                          (long long)c->head_dim, (long long)hd);
    if (!(isfinite(c->rope_theta) && c->rope_theta > 0))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"rope_theta\" is %g; it must be finite and > 0", fn, src, c->rope_theta);
    if (!(c->rms_norm_eps > 0 && c->rms_norm_eps < 1))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"rms_norm_eps\" is %g; it must be in (0, 1)", fn, src, c->rms_norm_eps);
    if (c->tie_word_embeddings != 0 && c->tie_word_embeddings != 1)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"tie_word_embeddings\" is %d; it must be 0 or 1", fn, src, c->tie_word_embeddings);
    if (!in_range(c->bos_token_id, -1, c->vocab_size - 1))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"bos_token_id\" %lld is not a token id of the vocabulary (0..%lld)", fn, src,
                          (long long)c->bos_token_id, (long long)(c->vocab_size - 1));
    if (c->n_eos < 0 || c->n_eos > FP4RL_HF_MAX_EOS)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: %d eos ids; at most %d are kept", fn, src, c->n_eos, FP4RL_HF_MAX_EOS);
    for (int i = 0; i < c->n_eos; i++)
        if (!in_range(c->eos_token_id[i], 0, c->vocab_size - 1))
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"eos_token_id\" %lld is not a token id of the vocabulary (0..%lld)", fn, src,
                              (long long)c->eos_token_id[i], (long long)(c->vocab_size - 1));
    return FP4RL_OK;
}

fp4rl_status fp4rl_hf_config_validate(const fp4rl_hf_config *cfg)
{
    if (!cfg) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_hf_config_validate: cfg is NULL");
    return check_cfg(cfg, "fp4rl_hf_config_validate", "config");
}

/* Whether a JSON text has a \u0000 escape inside a string (cJSON would cut the string there). */
static bool has_nul_escape(const char *s, size_t n)
{
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        if (!in_str) {
            in_str = s[i] == '"';
        } else if (s[i] == '"') {
            in_str = false;
        } else if (s[i] == '\\') {
            if (i + 5 < n && s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0) return true;
            i++;
        }
    }
    return false;
}

static int cmp_str_ptr(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* model_type and architectures: which model this is. Checked first, so that another model is
 * reported as such rather than by the first field it lacks. */
static fp4rl_status check_identity(const cJSON *root, const char *src)
{
    const char *fn = "fp4rl_hf_config_parse";
    fp4rl_status st = want_string(root, "model_type", "qwen2", true, src);
    if (st) return st;
    const cJSON *a = field(root, "architectures");
    if (a) {
        if (!cJSON_IsArray(a))
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"architectures\" is a JSON %s, not an array", fn, src, fp4rl_json_type(a));
        for (const cJSON *e = a->child; e; e = e->next) {
            if (!cJSON_IsString(e))
                return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: an entry of \"architectures\" is a JSON %s, not a string", fn, src, fp4rl_json_type(e));
            if (strcmp(e->valuestring, "Qwen2ForCausalLM") != 0)
                return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: %s: \"architectures\" names \"%.100s\"; fp4rl implements Qwen2ForCausalLM only",
                                  fn, src, e->valuestring);
        }
    }
    return FP4RL_OK;
}

/* The allow-list: every top-level key fp4rl understands. Each either feeds the struct, is checked
 * to have the one value fp4rl implements (check_features), or is metadata that cannot change the
 * model's math (bookkeeping of transformers and the hub; sliding_window and max_window_layers only
 * matter when use_sliding_window is true, which is refused). Any other key may change the math in
 * a way fp4rl would silently ignore, so it is refused, by name. */
static const char *const known_keys[] = {
    /* read into the struct or checked */
    "architectures", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim", "hidden_act", "hidden_size",
    "intermediate_size", "layer_types", "max_position_embeddings", "model_type", "num_attention_heads",
    "num_hidden_layers", "num_key_value_heads", "rms_norm_eps", "rope_parameters", "rope_scaling", "rope_theta",
    "tie_word_embeddings", "use_sliding_window", "vocab_size",
    /* metadata */
    "_name_or_path", "dtype", "torch_dtype", "transformers_version", "initializer_range", "use_cache", "pad_token_id",
    "sliding_window", "max_window_layers", "output_attentions", "output_hidden_states", "return_dict", "id2label",
    "label2id", "tokenizer_class", "is_encoder_decoder", "chunk_size_feed_forward", "problem_type",
};

static fp4rl_status check_known_keys(const cJSON *root, const char *src)
{
    for (const cJSON *k = root->child; k; k = k->next) {
        const char *key = k->string ? k->string : "";
        bool known = false;
        for (size_t i = 0; !known && i < sizeof known_keys / sizeof known_keys[0]; i++) known = strcmp(key, known_keys[i]) == 0;
        if (!known)
            return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "fp4rl_hf_config_parse: %s: field \"%.100s\" is not one fp4rl understands "
                              "(it may change the model; fp4rl refuses what it would silently ignore)", src, key);
    }
    return FP4RL_OK;
}

/* The RoPE base, in either spelling: "rope_theta" at the top level (transformers 4) or
 * "rope_parameters": {"rope_type": "default", "rope_theta": ...} (transformers 5). Any other rope
 * type or key of rope_parameters changes the rotary embedding and is refused; two spellings that
 * disagree are corrupt. */
static fp4rl_status get_rope_theta(const cJSON *root, double *theta, const char *src)
{
    const char *fn = "fp4rl_hf_config_parse";
    fp4rl_status st = get_double(root, "rope_theta", 10000.0, theta, src);
    if (st) return st;
    const cJSON *rp = field(root, "rope_parameters");
    if (!rp) return FP4RL_OK;
    if (!cJSON_IsObject(rp))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"rope_parameters\" is a JSON %s, not an object", fn, src, fp4rl_json_type(rp));
    for (const cJSON *k = rp->child; k; k = k->next)
        if (strcmp(k->string, "rope_type") != 0 && strcmp(k->string, "rope_theta") != 0)
            return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: %s: \"rope_parameters.%.60s\" is set; fp4rl implements plain RoPE only", fn, src,
                              k->string);
    const cJSON *type = field(rp, "rope_type");
    if (type && !cJSON_IsString(type))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"rope_parameters.rope_type\" is a JSON %s, not a string", fn, src, fp4rl_json_type(type));
    if (type && strcmp(type->valuestring, "default") != 0)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: %s: \"rope_parameters.rope_type\" is \"%.60s\"; fp4rl implements \"default\" only",
                          fn, src, type->valuestring);
    if (!field(rp, "rope_theta")) return FP4RL_OK;
    double t = 0;
    if ((st = get_double(rp, "rope_theta", 0, &t, src))) return st;
    if (field(root, "rope_theta") && t != *theta)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"rope_theta\" %g and \"rope_parameters.rope_theta\" %g disagree", fn, src, *theta, t);
    *theta = t;
    return FP4RL_OK;
}

/* The features fp4rl does not implement; c has its sizes. */
static fp4rl_status check_features(const cJSON *root, const fp4rl_hf_config *c, const char *src)
{
    const char *fn = "fp4rl_hf_config_parse";
    fp4rl_status st0 = check_known_keys(root, src);
    if (st0) return st0;
    fp4rl_status st = want_string(root, "hidden_act", "silu", false, src);
    if (st) return st;
    const cJSON *rs = field(root, "rope_scaling");
    if (rs) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: %s: \"rope_scaling\" is set; fp4rl implements plain RoPE only", fn, src);
    int sw = 0;
    if ((st = get_bool(root, "use_sliding_window", 0, &sw, src))) return st;
    if (sw) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: %s: \"use_sliding_window\" is true; fp4rl implements full attention only", fn, src);
    const cJSON *lt = field(root, "layer_types");
    if (lt) {
        if (!cJSON_IsArray(lt))
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"layer_types\" is a JSON %s, not an array", fn, src, fp4rl_json_type(lt));
        int64_t n = 0;
        for (const cJSON *e = lt->child; e; e = e->next, n++) {
            if (!cJSON_IsString(e))
                return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"layer_types\"[%lld] is a JSON %s, not a string", fn, src, (long long)n, fp4rl_json_type(e));
            if (strcmp(e->valuestring, "full_attention") != 0)
                return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: %s: \"layer_types\"[%lld] is \"%.60s\"; fp4rl implements full_attention only",
                                  fn, src, (long long)n, e->valuestring);
        }
        if (n != c->num_hidden_layers)
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"layer_types\" has %lld entries but \"num_hidden_layers\" is %lld", fn, src,
                              (long long)n, (long long)c->num_hidden_layers);
    }
    double drop = 0.0;
    if ((st = get_double(root, "attention_dropout", 0.0, &drop, src))) return st;
    if (drop != 0.0)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: %s: \"attention_dropout\" is %g; fp4rl implements no dropout", fn, src, drop);
    return FP4RL_OK;
}

static fp4rl_status parse_root(const cJSON *root, fp4rl_hf_config *c, const char *src)
{
    const char *fn = "fp4rl_hf_config_parse";
    fp4rl_status st = check_identity(root, src);
    if (st) return st;
    if ((st = get_int(root, "vocab_size", true, 0, &c->vocab_size, src)) ||
        (st = get_int(root, "hidden_size", true, 0, &c->hidden_size, src)) ||
        (st = get_int(root, "intermediate_size", true, 0, &c->intermediate_size, src)) ||
        (st = get_int(root, "num_hidden_layers", true, 0, &c->num_hidden_layers, src)) ||
        (st = get_int(root, "num_attention_heads", true, 0, &c->num_attention_heads, src)) ||
        (st = get_int(root, "max_position_embeddings", true, 0, &c->max_position_embeddings, src)))
        return st;
    /* Bounds before anything divides by a head count or uses it as a default. */
    if (!in_range(c->num_attention_heads, 1, FP4RL_HF_MAX_HEADS))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"num_attention_heads\" is %lld; it must be an integer in [1, %d]", fn, src,
                          (long long)c->num_attention_heads, FP4RL_HF_MAX_HEADS);
    if ((st = get_int(root, "num_key_value_heads", false, c->num_attention_heads, &c->num_key_value_heads, src))) return st;
    if (!in_range(c->num_key_value_heads, 1, FP4RL_HF_MAX_HEADS))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"num_key_value_heads\" is %lld; it must be an integer in [1, %d]", fn, src,
                          (long long)c->num_key_value_heads, FP4RL_HF_MAX_HEADS);
    int64_t hd = c->hidden_size / c->num_attention_heads, hd_field;
    if ((st = get_int(root, "head_dim", false, hd, &hd_field, src))) return st;
    c->head_dim = hd;
    if ((st = get_rope_theta(root, &c->rope_theta, src)) ||
        (st = get_double(root, "rms_norm_eps", 1e-6, &c->rms_norm_eps, src)) ||
        (st = get_bool(root, "tie_word_embeddings", 0, &c->tie_word_embeddings, src)) ||
        (st = get_int(root, "bos_token_id", false, -1, &c->bos_token_id, src)))
        return st;
    const cJSON *eos = field(root, "eos_token_id");
    c->n_eos = 0;
    if (cJSON_IsArray(eos)) {
        int n = 0;
        for (const cJSON *e = eos->child; e; e = e->next, n++) {
            if (n >= FP4RL_HF_MAX_EOS)
                return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: %s: \"eos_token_id\" lists more than %d ids", fn, src, FP4RL_HF_MAX_EOS);
            double d = cJSON_IsNumber(e) ? e->valuedouble : -1.5;
            if (!(d >= 0 && d < HF_MAX_EXACT) || d != floor(d))
                return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"eos_token_id\"[%d] is not a non-negative integer", fn, src, n);
            c->eos_token_id[n] = (int64_t)d;
        }
        c->n_eos = n;
    } else if (eos) {
        if ((st = get_int(root, "eos_token_id", false, -1, &c->eos_token_id[0], src))) return st;
        c->n_eos = 1;
    }
    if ((st = check_cfg(c, fn, src))) return st;
    if (hd_field != hd)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: %s: \"head_dim\" is %lld, not hidden_size / num_attention_heads = %lld; fp4rl derives it",
                          fn, src, (long long)hd_field, (long long)hd);
    return check_features(root, c, src);
}

static fp4rl_status parse(fp4rl_hf_config *out, const char *text, size_t len, const char *src)
{
    const char *fn = "fp4rl_hf_config_parse";
    if (!out || (!text && len)) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out or text is NULL", fn);
    if (len > HF_MAX_FILE) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: %zu bytes; a config.json is at most %zu", fn, src, len, HF_MAX_FILE);
    size_t bad;
    if (!fp4rl_utf8_valid((const uint8_t *)text, len, &bad))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: not valid UTF-8 (at byte %zu)", fn, src, bad);
    char *copy = malloc(len + 1); /* cJSON gets a NUL-terminated copy */
    if (!copy) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (len) memcpy(copy, text, len);
    copy[len] = 0;
    fp4rl_status st = FP4RL_OK;
    const char *end = NULL;
    cJSON *root = NULL;
    const char **keys = NULL;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)copy[i] < 0x20 && !strchr(" \t\n\r", copy[i])) {
            st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: control byte 0x%02x at byte %zu", fn, src, (unsigned char)copy[i], i);
            goto out;
        }
    if (has_nul_escape(copy, len)) {
        st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: a string has a \\u0000 escape", fn, src);
        goto out;
    }
    root = cJSON_ParseWithLengthOpts(copy, len, &end, 0);
    if (!root) {
        size_t at = end && end >= copy && end <= copy + len ? (size_t)(end - copy) : 0;
        st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: not valid JSON (error near byte %zu)", fn, src, at);
        goto out;
    }
    for (const char *p = end; p < copy + len; p++)
        if (!strchr(" \t\n\r", *p)) {
            st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: bytes after the JSON object (at byte %zu)", fn, src, (size_t)(p - copy));
            goto out;
        }
    if (!cJSON_IsObject(root)) {
        st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: the text is a JSON %s, not an object", fn, src, fp4rl_json_type(root));
        goto out;
    }
    size_t nk = 0;
    for (const cJSON *k = root->child; k; k = k->next) nk++;
    keys = malloc((nk ? nk : 1) * sizeof *keys);
    if (!keys) {
        st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        goto out;
    }
    nk = 0;
    for (const cJSON *k = root->child; k; k = k->next) keys[nk++] = k->string ? k->string : "";
    qsort(keys, nk, sizeof *keys, cmp_str_ptr);
    for (size_t i = 1; i < nk; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0) {
            st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: key \"%.100s\" appears twice", fn, src, keys[i]);
            goto out;
        }
    fp4rl_hf_config c;
    memset(&c, 0, sizeof c);
    st = parse_root(root, &c, src);
    if (!st) *out = c;
out:
    free(keys);
    cJSON_Delete(root);
    free(copy);
    return st;
}

fp4rl_status fp4rl_hf_config_parse(fp4rl_hf_config *out, const char *text, size_t len)
{
    return parse(out, text, len, "config.json text");
}

fp4rl_status fp4rl_hf_config_load(fp4rl_hf_config *out, const char *path)
{
    if (!out || !path) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_hf_config_load: out or path is NULL");
    uint8_t *buf = NULL;
    size_t len = 0;
    fp4rl_status st = fp4rl_read_file(path, HF_MAX_FILE, &buf, &len, "fp4rl_hf_config_load");
    if (st) return st;
    char src[160];
    snprintf(src, sizeof src, "'%s'", path);
    st = parse(out, (const char *)buf, len, src);
    free(buf);
    return st;
}

/* ---- writer --------------------------------------------------------------------------------- */

/* The shortest "%.Ng" that reads back to exactly v, with '.' as the decimal point whatever the
 * locale, and ".0" added to an integral value so that Python reads it as a float. */
static void fmt_double(char *buf, size_t n, double v)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    bool frac = false;
    for (char *p = buf; *p; p++) {
        if (!strchr("0123456789+-eE", *p)) *p = '.'; /* the locale's decimal point */
        if (*p == '.' || *p == 'e' || *p == 'E') frac = true;
    }
    if (!frac && strlen(buf) + 3 <= n) strcat(buf, ".0");
}

static bool jadd_int(cJSON *o, const char *key, int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    return fp4rl_json_add(o, key, cJSON_CreateRaw(buf));
}
static bool jadd_double(cJSON *o, const char *key, double v)
{
    char buf[48];
    fmt_double(buf, sizeof buf, v);
    return fp4rl_json_add(o, key, cJSON_CreateRaw(buf));
}

/* Both spellings of the RoPE base: "rope_parameters" for transformers 5, "rope_theta" for 4. */
static bool jadd_rope(cJSON *o, double theta)
{
    cJSON *rp = cJSON_CreateObject();
    return fp4rl_json_add(o, "rope_parameters", rp) && jadd_double(rp, "rope_theta", theta) &&
           fp4rl_json_add(rp, "rope_type", cJSON_CreateString("default"));
}

fp4rl_status fp4rl_hf_config_to_json(const fp4rl_hf_config *c, char **out)
{
    const char *fn = "fp4rl_hf_config_to_json";
    if (!c || !out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: cfg or out is NULL", fn);
    fp4rl_status st = check_cfg(c, fn, "config");
    if (st) return st;
    /* Keys in sorted order, as transformers writes them. */
    cJSON *root = cJSON_CreateObject(), *arch = cJSON_CreateArray();
    bool ok = root && fp4rl_json_add(root, "architectures", arch) && cJSON_AddItemToArray(arch, cJSON_CreateString("Qwen2ForCausalLM"));
    if (!root) cJSON_Delete(arch);
    ok = ok && jadd_double(root, "attention_dropout", 0.0);
    if (ok && c->bos_token_id >= 0) ok = jadd_int(root, "bos_token_id", c->bos_token_id);
    if (ok && c->n_eos == 1) ok = jadd_int(root, "eos_token_id", c->eos_token_id[0]);
    if (ok && c->n_eos > 1) {
        cJSON *eos = cJSON_CreateArray();
        ok = fp4rl_json_add(root, "eos_token_id", eos);
        for (int i = 0; ok && i < c->n_eos; i++) {
            char buf[32];
            snprintf(buf, sizeof buf, "%lld", (long long)c->eos_token_id[i]);
            cJSON *r = cJSON_CreateRaw(buf);
            ok = r && cJSON_AddItemToArray(eos, r);
            if (!ok) cJSON_Delete(r);
        }
    }
    ok = ok && jadd_int(root, "head_dim", c->head_dim) && fp4rl_json_add(root, "hidden_act", cJSON_CreateString("silu")) &&
         jadd_int(root, "hidden_size", c->hidden_size) && jadd_int(root, "intermediate_size", c->intermediate_size) &&
         jadd_int(root, "max_position_embeddings", c->max_position_embeddings) &&
         fp4rl_json_add(root, "model_type", cJSON_CreateString("qwen2")) && jadd_int(root, "num_attention_heads", c->num_attention_heads) &&
         jadd_int(root, "num_hidden_layers", c->num_hidden_layers) && jadd_int(root, "num_key_value_heads", c->num_key_value_heads) &&
         jadd_double(root, "rms_norm_eps", c->rms_norm_eps) && jadd_rope(root, c->rope_theta) && jadd_double(root, "rope_theta", c->rope_theta) &&
         fp4rl_json_add(root, "tie_word_embeddings", cJSON_CreateBool(c->tie_word_embeddings)) &&
         fp4rl_json_add(root, "use_sliding_window", cJSON_CreateBool(0)) && jadd_int(root, "vocab_size", c->vocab_size);
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    /* Hand back memory the caller frees with free(), whatever allocator cJSON was built with. */
    size_t n = strlen(text);
    char *res = malloc(n + 2);
    if (res) {
        memcpy(res, text, n);
        res[n] = '\n';
        res[n + 1] = 0;
    }
    cJSON_free(text);
    if (!res) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    *out = res;
    return FP4RL_OK;
}

/*
 * checkpoint.c - the RL session's full state in a directory:
 *   model.safetensors      master weights, HF names (loadable by HF transformers too)
 *   optimizer.safetensors  AdamW moments "adam_m", "adam_v" in the model's storage (F32, or BF16 with
 *                          FP4RL_MP_OPTIMIZER_MOMENTS = 1), and "ref_w" (F32), the KL reference
 *   state.json             steps, random state, hyper-parameters, policy, stop tokens, config, the
 *                          moments' dtype ("optimizer_moments": "f32" or "bf16"; absent before BF16
 *                          moments existed, when they were F32)
 *   .fp4rl-checkpoint      the marker, written last (core/io/atomic_dir.c)
 * Written atomically through core/io/atomic_dir.c, which replaces only a previous checkpoint: a
 * directory holding the marker, or one written before the marker existed, recognised by its
 * state.json's "format": "fp4rl-rl-checkpoint" (adopted: the marker is added before the save).
 * A regular file, any other directory or a special file at `dir` is refused and left untouched.
 * A crash at any point leaves a complete checkpoint at `dir` (or moved aside, which the next save
 * or load puts back); `dir.old`, left by a crash of a save of earlier versions, is still read.
 * In a distributed context rank 0 writes (core/rl/session.c) and every rank reads; a load commits
 * only when it succeeded on every rank.
 */
#define _GNU_SOURCE /* fsync */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/atomic_dir.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "rl/session.h"

#define STATE_FORMAT "fp4rl-rl-checkpoint"
#define STATE_VERSION 1
#define MARKER ".fp4rl-checkpoint"
#define SESSION_PARAMS_V1 16 /* session parameters of the first checkpoints (up to FP4RL_RL_SEED) */
#define MODEL_PARAMS_V1 6    /* model parameters of checkpoints before the micro-batch knobs (up to FP4RL_MP_GRAD_CLIP) */

static char *state_json(const fp4rl_rl_session *s)
{
    const fp4rl_model *m = s->model;
    uint64_t seed, off;
    fp4rl_context_get_rng(s->model->ctx, &seed, &off);
    cJSON *root = cJSON_CreateObject();
    char num[32];
    cJSON_AddStringToObject(root, "format", STATE_FORMAT);
    cJSON_AddNumberToObject(root, "version", STATE_VERSION);
    cJSON_AddNumberToObject(root, "session_steps", (double)s->steps);
    cJSON_AddNumberToObject(root, "model_step", (double)fp4rl_model_optimizer_step(m));
    /* 64-bit counters as decimal strings: JSON numbers are doubles */
    snprintf(num, sizeof num, "%llu", (unsigned long long)seed);
    cJSON_AddStringToObject(root, "context_seed", num);
    snprintf(num, sizeof num, "%llu", (unsigned long long)off);
    cJSON_AddStringToObject(root, "context_rng_offset", num);
    snprintf(num, sizeof num, "%llu", (unsigned long long)s->sample_offset);
    cJSON_AddStringToObject(root, "sample_offset", num);
    cJSON *hp = cJSON_AddArrayToObject(root, "session_params");
    for (int i = 0; i < FP4RL_RL_PARAM_COUNT; i++) cJSON_AddItemToArray(hp, cJSON_CreateNumber(s->hp[i]));
    cJSON *mh = cJSON_AddArrayToObject(root, "model_params");
    for (int i = 0; i < FP4RL_MP_COUNT; i++) cJSON_AddItemToArray(mh, cJSON_CreateNumber(fp4rl_model_hparams(m)[i]));
    cJSON *pol = cJSON_AddArrayToObject(root, "policy");
    for (int i = 0; i < FP4RL_QP_COUNT; i++)
        cJSON_AddItemToArray(pol, cJSON_CreateNumber((double)fp4rl_policy_value(fp4rl_model_policy(m), (fp4rl_qparam)i)));
    cJSON *stop = cJSON_AddArrayToObject(root, "stop_tokens");
    for (size_t i = 0; i < s->n_stop; i++) cJSON_AddItemToArray(stop, cJSON_CreateNumber(s->stop[i]));
    cJSON_AddBoolToObject(root, "has_ref", s->ref_w != NULL);
    cJSON_AddStringToObject(root, "optimizer_moments", fp4rl_model_moments_bf16(m) ? "bf16" : "f32");
    char *cfg = NULL;
    if (fp4rl_hf_config_to_json(fp4rl_model_config(m), &cfg) == FP4RL_OK) {
        cJSON_AddItemToObject(root, "config", cJSON_Parse(cfg));
        free(cfg);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

static fp4rl_status write_file_synced(const char *path, const char *text, const char *fn)
{
    FILE *f = fopen(path, "wb");
    if (!f) return fp4rl_fail(FP4RL_ERR_IO, "%s: cannot create %s: %s", fn, path, strerror(errno));
    int ok = fwrite(text, 1, strlen(text), f) == strlen(text) && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0) ok = 0;
    return ok ? FP4RL_OK : fp4rl_fail(FP4RL_ERR_IO, "%s: writing %s: %s", fn, path, strerror(e));
}

/* A checkpoint written before the marker existed: a directory whose state.json says it is one. */
static int legacy_checkpoint(const char *dir)
{
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/" MARKER, dir);
    if (lstat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode) || lstat(path, &sb) == 0) return 0;
    snprintf(path, sizeof path, "%s/state.json", dir);
    uint8_t *text = NULL;
    size_t len = 0;
    if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || fp4rl_read_file(path, 1u << 24, &text, &len, "legacy") != FP4RL_OK) return 0;
    cJSON *root = cJSON_ParseWithLength((const char *)text, len);
    free(text);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const int ours = cJSON_IsString(fmt) && strcmp(fmt->valuestring, STATE_FORMAT) == 0;
    cJSON_Delete(root);
    return ours;
}

fp4rl_status fp4rl_session_save(const fp4rl_rl_session *s, const char *dir)
{
    const char *fn = "fp4rl_rl_session_save";
    const fp4rl_model *m = s->model;
    fp4rl_context *ctx = s->model->ctx;
    char *tmp = NULL, path[4200];
    fp4rl_status st = legacy_checkpoint(dir) ? fp4rl_dir_mark(dir, MARKER, fn) : FP4RL_OK;
    if (!st) st = fp4rl_dir_stage(dir, MARKER, &tmp, fn);
    if (st) return st;
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    st = fp4rl_model_save(m, path, FP4RL_DTYPE_F32);
    /* optimizer moments (and the KL reference), straight from the device */
    const int64_t n = fp4rl_model_param_floats(m);
    const size_t bytes = (size_t)n * sizeof(float);
    float *host = st ? NULL : malloc(bytes * 3);
    if (!st && !host) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    if (!st) st = fp4rl_model_moments_to_host(m, host, host + n);
    if (!st && s->ref_w) st = ctx->be->download(ctx, host + 2 * n, s->ref_w, bytes);
    if (!st) {
        const int64_t shape[1] = {n};
        /* BF16 moments come widened: stored as BF16 again, to nearest, they are their own bits */
        const int bf16 = fp4rl_model_moments_bf16(m);
        const fp4rl_st_write_entry e[3] = {{"adam_m", FP4RL_DTYPE_F32, 1, shape, host, bf16},
                                           {"adam_v", FP4RL_DTYPE_F32, 1, shape, host + n, bf16},
                                           {"ref_w", FP4RL_DTYPE_F32, 1, shape, host + 2 * n, 0}};
        snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
        st = fp4rl_st_write_path(path, e, s->ref_w ? 3 : 2, NULL, 0);
    }
    free(host);
    if (!st) {
        char *text = state_json(s);
        snprintf(path, sizeof path, "%s/state.json", tmp);
        st = text ? write_file_synced(path, text, fn) : fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        free(text);
    }
    if (st) {
        fp4rl_dir_abort(tmp);
        return st;
    }
    return fp4rl_dir_commit(tmp, dir, MARKER, fn);
}

/* ---- load ---- */
static fp4rl_status parse_u64(const cJSON *root, const char *key, uint64_t *out, const char *fn, const char *file)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    char *end = NULL;
    if (!cJSON_IsString(v) || !v->valuestring[0]) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"%s\" is missing or not a string", fn, file, key);
    errno = 0;
    unsigned long long x = strtoull(v->valuestring, &end, 10);
    if (errno || *end || v->valuestring[0] == '-') return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"%s\" is not a decimal u64", fn, file, key);
    *out = (uint64_t)x;
    return FP4RL_OK;
}

/* A step counter: an integral JSON number in 0 .. 2^53. */
static int counter_ok(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 9007199254740992.0 && v->valuedouble == floor(v->valuedouble);
}

/* An array of min_n .. n numbers into out[0 ..); entries past its end keep their values (parameters
 * added after the checkpoint was written). */
static fp4rl_status number_array(const cJSON *root, const char *key, double *out, int min_n, int n, const char *fn,
                                 const char *file)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, key);
    const int size = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
    if (size < min_n || size > n) {
        if (min_n == n) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"%s\" must be an array of %d numbers", fn, file, key, n);
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"%s\" must be an array of %d to %d numbers", fn, file, key, min_n, n);
    }
    for (int i = 0; i < size; i++) {
        const cJSON *v = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsNumber(v)) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"%s\"[%d] is not a number", fn, file, key, i);
        out[i] = v->valuedouble;
    }
    return FP4RL_OK;
}

fp4rl_status fp4rl_session_load(fp4rl_rl_session *s, const char *dir)
{
    const char *fn = "fp4rl_rl_session_load";
    fp4rl_model *m = s->model;
    fp4rl_context *ctx = s->model->ctx;
    char base[4096], path[4200];
    struct stat sb;
    /* a killed save's leftovers: rank 0 puts a checkpoint moved aside back and removes the rest;
     * the other ranks wait for it (a collective) */
    if (!fp4rl_dist_active(ctx) || ctx->rank == 0) fp4rl_dir_recover(dir, MARKER);
    if (fp4rl_dist_active(ctx)) fp4rl_dist_agree(ctx, FP4RL_OK, fn);
    snprintf(base, sizeof base, "%s", dir);
    if (stat(base, &sb) != 0) { /* a crash between the two renames of a save of earlier versions left dir.old */
        snprintf(base, sizeof base, "%s.old", dir);
        if (stat(base, &sb) != 0) return fp4rl_dist_agree(ctx, fp4rl_fail(FP4RL_ERR_IO, "%s: no checkpoint at %s", fn, dir), fn);
    }
    snprintf(path, sizeof path, "%s/state.json", base);
    uint8_t *text = NULL;
    size_t len = 0;
    fp4rl_status st = fp4rl_read_file(path, 1u << 24, &text, &len, fn);
    if (st) return fp4rl_dist_agree(ctx, st, fn);
    cJSON *root = cJSON_ParseWithLength((const char *)text, len);
    free(text);
    if (!root) return fp4rl_dist_agree(ctx, fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s is not valid JSON", fn, path), fn);
    double steps = 0, mstep = 0, hp[FP4RL_RL_PARAM_COUNT], mh[FP4RL_MP_COUNT], pol[FP4RL_QP_COUNT];
    uint64_t seed = 0, off = 0, soff = 0;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format"), *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, STATE_FORMAT) != 0 || !cJSON_IsNumber(ver) || ver->valuedouble != STATE_VERSION)
        st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s is not an fp4rl RL checkpoint of version %d", fn, path, STATE_VERSION);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(root, "session_steps"), *jm = cJSON_GetObjectItemCaseSensitive(root, "model_step");
    if (!st && (!counter_ok(js) || !counter_ok(jm)))
        st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"%s\" is missing or not an integer in 0 .. 2^53", fn, path,
                        counter_ok(js) ? "model_step" : "session_steps");
    if (!st) { steps = js->valuedouble; mstep = jm->valuedouble; }
    if (!st) st = parse_u64(root, "context_seed", &seed, fn, path);
    if (!st) st = parse_u64(root, "context_rng_offset", &off, fn, path);
    if (!st) st = parse_u64(root, "sample_offset", &soff, fn, path);
    /* checkpoints of version 1 written before FP4RL_RL_ALLREDUCE_BF16 have 16 session parameters,
     * before the micro-batch knobs 17 and 6 model parameters: the missing ones keep the session's
     * and the model's values */
    memcpy(hp, s->hp, sizeof hp);
    memcpy(mh, fp4rl_model_hparams(m), sizeof mh);
    if (!st) st = number_array(root, "session_params", hp, SESSION_PARAMS_V1, FP4RL_RL_PARAM_COUNT, fn, path);
    if (!st) st = number_array(root, "model_params", mh, MODEL_PARAMS_V1, FP4RL_MP_COUNT, fn, path);
    if (!st) st = number_array(root, "policy", pol, FP4RL_QP_COUNT, FP4RL_QP_COUNT, fn, path);
    /* exactly the setters' bounds (one definition each) */
    for (int i = 0; !st && i < FP4RL_RL_PARAM_COUNT; i++) {
        const char *allowed = fp4rl_rl_param_allowed(s, i, hp[i]);
        if (allowed) st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: session_params[%d] (%s) = %g is out of range; allowed: %s", fn, path, i,
                                     fp4rl_rl_param_name(i), hp[i], allowed);
    }
    for (int i = 0; !st && i < FP4RL_MP_COUNT; i++) {
        const char *allowed = fp4rl_model_hparam_allowed(i, mh[i]);
        if (allowed) st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: model_params[%d] (%s) = %g is out of range; allowed: %s", fn, path, i,
                                     fp4rl_model_hparam_name(i), mh[i], allowed);
    }
    for (int i = 0; !st && i < FP4RL_QP_COUNT; i++)
        if (!(pol[i] == floor(pol[i]) && fabs(pol[i]) <= 9007199254740992.0))
            st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: policy[%d] = %g is not an integer", fn, path, i, pol[i]);
    /* the checkpoint must be of this model's shape */
    if (!st) {
        const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "config");
        char *ctext = cfg ? cJSON_PrintUnformatted(cfg) : NULL;
        fp4rl_hf_config c;
        st = ctext ? fp4rl_hf_config_parse(&c, ctext, strlen(ctext)) : fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s has no config", fn, path);
        free(ctext);
        const fp4rl_hf_config *mc = fp4rl_model_config(m);
        if (!st && (c.vocab_size != mc->vocab_size || c.hidden_size != mc->hidden_size ||
                    c.intermediate_size != mc->intermediate_size || c.num_hidden_layers != mc->num_hidden_layers ||
                    c.num_attention_heads != mc->num_attention_heads || c.num_key_value_heads != mc->num_key_value_heads ||
                    c.tie_word_embeddings != mc->tie_word_embeddings))
            st = fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: the checkpoint at %s is of another model shape", fn, base);
    }
    /* new objects first; the live state changes only when everything is in hand */
    fp4rl_quant_policy *np = NULL;
    int32_t *stop = NULL;
    size_t n_stop = 0;
    if (!st) st = fp4rl_quant_policy_create(&np);
    for (int i = 0; !st && i < FP4RL_QP_COUNT; i++) {
        /* a policy is validated by its setters; formats before tiles (a tile is checked against its format) */
        static const int order[FP4RL_QP_COUNT] = {8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14};
        const double v = pol[order[i]];
        st = v >= -9007199254740992.0 && v <= 9007199254740992.0
                 ? fp4rl_quant_policy_set(np, (fp4rl_qparam)order[i], (int64_t)v)
                 : fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "[%d] is %g, out of range", order[i], v);
        if (st) st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: policy: %s", fn, path, fp4rl_last_error());
    }
    const cJSON *js_stop = cJSON_GetObjectItemCaseSensitive(root, "stop_tokens");
    if (!st && !cJSON_IsArray(js_stop)) st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: stop_tokens is not an array", fn, path);
    if (!st && cJSON_GetArraySize(js_stop) > 1024) st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: more than 1024 stop_tokens", fn, path);
    if (!st && (n_stop = (size_t)cJSON_GetArraySize(js_stop)) > 0) {
        stop = malloc(n_stop * sizeof *stop);
        if (!stop) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        for (size_t i = 0; !st && i < n_stop; i++) {
            const cJSON *v = cJSON_GetArrayItem(js_stop, (int)i);
            if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= (double)fp4rl_model_config(m)->vocab_size || v->valuedouble != floor(v->valuedouble))
                st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: stop_tokens[%zu] is not a token id", fn, path, i);
            else stop[i] = (int32_t)v->valuedouble;
        }
    }
    const int has_ref = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "has_ref"));
    /* the moments' dtype in the file: "optimizer_moments" when written (absent before BF16 moments: F32) */
    const cJSON *jmom = cJSON_GetObjectItemCaseSensitive(root, "optimizer_moments");
    fp4rl_st_dtype file_moments = FP4RL_ST_F32;
    if (!st && jmom && !(cJSON_IsString(jmom) && (strcmp(jmom->valuestring, "f32") == 0 || strcmp(jmom->valuestring, "bf16") == 0)))
        st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"optimizer_moments\" must be \"f32\" or \"bf16\"", fn, path);
    if (!st && jmom && strcmp(jmom->valuestring, "bf16") == 0) file_moments = FP4RL_ST_BF16;
    cJSON_Delete(root);
    /* tensors */
    const int64_t n = fp4rl_model_param_floats(m);
    const size_t bytes = (size_t)n * sizeof(float);
    float *host = st ? NULL : malloc(bytes * 4);
    if (!st && !host) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    fp4rl_st *fw = NULL, *fo = NULL;
    if (!st) {
        snprintf(path, sizeof path, "%s/model.safetensors", base);
        st = fp4rl_st_open_path(&fw, path);
    }
    if (!st) st = fp4rl_model_read_weights(m, fw, host);
    if (!st) {
        snprintf(path, sizeof path, "%s/optimizer.safetensors", base);
        st = fp4rl_st_open_path(&fo, path);
    }
    const int64_t shape[1] = {n};
    static const char *const moment_names[2] = {"adam_m", "adam_v"};
    for (int k = 0; !st && k < 2; k++) {
        const fp4rl_st_tensor *t = fp4rl_st_find(fo, moment_names[k]);
        if (t && t->dtype != file_moments)
            st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: %s is %s but state.json says the moments are %s", fn, path,
                            moment_names[k], fp4rl_st_dtype_name(t->dtype), fp4rl_st_dtype_name(file_moments));
        if (!st) st = fp4rl_st_read_f32(fo, moment_names[k], 1, shape, host + (k + 1) * n); /* BF16 widens exactly */
    }
    if (!st && has_ref) st = fp4rl_st_read_f32(fo, "ref_w", 1, shape, host + 3 * n);
    fp4rl_st_close(fw);
    fp4rl_st_close(fo);
    float *ref = NULL;
    if (!st && has_ref && !s->ref_w) st = ctx->be->alloc(ctx, (void **)&ref, bytes);
    /* the moments' storage is the checkpoint's setting (or, from a checkpoint that predates it,
     * the model's): buffers of the other storage, or any when the model holds none yet (before
     * its first update), are made before the commit. Moments stored in
     * another dtype than that (an old F32 checkpoint into BF16 moments) are rounded to nearest
     * into it by fp4rl_model_state_from_host. */
    const int moments_bf16 = mh[FP4RL_MP_OPTIMIZER_MOMENTS] != 0;
    void *new_m = NULL, *new_v = NULL;
    if (!st && (moments_bf16 != fp4rl_model_moments_bf16(m) || !fp4rl_model_moments_held(m))) st = fp4rl_model_moments_alloc(m, moments_bf16, &new_m, &new_v);
    /* a distributed context commits only when every rank has read the checkpoint */
    st = fp4rl_dist_agree(ctx, st, fn);
    if (st) {
        fp4rl_model_moments_discard(m, new_m, new_v);
        if (ref) ctx->be->free(ctx, ref);
        free(host);
        free(stop);
        fp4rl_quant_policy_destroy(np);
        return st;
    }
    /* commit */
    if (new_m) fp4rl_model_moments_adopt(m, moments_bf16, new_m, new_v);
    st = fp4rl_model_state_from_host(m, host, host + n, host + 2 * n);
    if (ref) s->ref_w = ref;
    if (!st && has_ref) st = ctx->be->upload(ctx, s->ref_w, host + 3 * n, bytes);
    if (!st && !has_ref && s->ref_w) {
        ctx->be->free(ctx, s->ref_w);
        s->ref_w = NULL;
    }
    free(host);
    fp4rl_model_restore_training(m, np, mh, (int64_t)mstep);
    memcpy(s->hp, hp, sizeof hp);
    free(s->stop);
    s->stop = stop;
    s->n_stop = n_stop;
    s->steps = (int64_t)steps;
    s->sample_offset = soff;
    ctx->seed = seed;
    ctx->rng_offset = off;
    return st;
}

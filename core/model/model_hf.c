/* model_hf.c - models as transformers and the hub write them: weights from one safetensors file or
 * an index and its shards (fp4rl_model_load), and whole directories (fp4rl_model_from_pretrained).
 *
 * A load validates before it changes anything: every shard is mapped and its header checked, and
 * every parameter is found, with its shape and a convertible dtype, in the file the index names.
 * Only then are the tensors converted one at a time into a host staging buffer of the largest
 * tensor's size and uploaded to their place in the device buffer (no second full host copy).
 * After validation only the device upload can fail (out of device memory is excluded: nothing is
 * allocated on the device), so a failed load leaves the weights as they were. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "io/atomic_dir.h"
#include "io/safetensors.h"
#include "model/model.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define MAX_JSON ((size_t)64 << 20)
#define MAX_SHARDS 4096

/* Re-raises the thread's message with a prefix (the status stays). */
static fp4rl_status wrap(fp4rl_status st, const char *fn, const char *what)
{
    char msg[1200];
    snprintf(msg, sizeof msg, "%s", fp4rl_last_error());
    return fp4rl_fail(st, "%s: %s%s%s", fn, what ? what : "", what ? ": " : "", msg);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The shards of one load: their names (relative to the index's folder) and open files. */
typedef struct shards {
    int n;
    char **name;
    fp4rl_st **f;
    cJSON *index;             /* the parsed index (NULL for one file) */
    const cJSON *weight_map;
} shards;

static void shards_free(shards *s)
{
    for (int i = 0; i < s->n; i++) {
        fp4rl_st_close(s->f[i]);
        free(s->name[i]);
    }
    free(s->f);
    free(s->name);
    cJSON_Delete(s->index);
    memset(s, 0, sizeof *s);
}

/* The index of shard `name`, adding it when new. */
static fp4rl_status shard_slot(shards *s, const char *name, int *at, const char *fn)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->name[i], name) == 0) {
            *at = i;
            return FP4RL_OK;
        }
    if (s->n >= MAX_SHARDS) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: more than %d shards", fn, MAX_SHARDS);
    char **nn = realloc(s->name, (size_t)(s->n + 1) * sizeof *nn);
    if (nn) s->name = nn;
    fp4rl_st **nf = nn ? realloc(s->f, (size_t)(s->n + 1) * sizeof *nf) : NULL;
    if (nf) s->f = nf;
    char *copy = nf ? strdup(name) : NULL;
    if (!copy) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    s->name[s->n] = copy;
    s->f[s->n] = NULL;
    *at = s->n++;
    return FP4RL_OK;
}

static int cmp_str_ptr(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Parses the index at `path`: {"metadata": {...}, "weight_map": {"tensor": "shard file", ...}}.
 * Shard names must be plain file names in the index's folder (no '/', not "." or ".."). */
static fp4rl_status read_index(shards *s, const char *path, const char *fn)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    fp4rl_status st = fp4rl_read_file(path, MAX_JSON, &buf, &len, fn);
    if (st) return st;
    size_t bad;
    const char *end = NULL;
    if (!fp4rl_utf8_valid(buf, len, &bad)) {
        free(buf);
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: '%.300s': not valid UTF-8 (at byte %zu)", fn, path, bad);
    }
    s->index = cJSON_ParseWithLengthOpts((const char *)buf, len, &end, 0);
    int trailing = 0;
    if (s->index && end)
        for (const char *p = end; p < (const char *)buf + len; p++) trailing |= !strchr(" \t\n\r", *p);
    free(buf);
    if (!s->index || trailing) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: '%.300s': not a JSON text", fn, path);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(s->index, "weight_map");
    if (!cJSON_IsObject(s->index) || !cJSON_IsObject(wm))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: '%.300s': no \"weight_map\" object", fn, path);
    s->weight_map = wm;
    size_t nk = 0;
    for (const cJSON *e = wm->child; e; e = e->next) {
        nk++;
        const char *v = cJSON_IsString(e) ? e->valuestring : NULL;
        if (!v || !*v || strchr(v, '/') || strcmp(v, ".") == 0 || strcmp(v, "..") == 0 || strlen(v) > 255)
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: '%.300s': \"weight_map\" entry \"%.200s\" is not a shard file name in the index's folder",
                              fn, path, e->string ? e->string : "");
        int at;
        if ((st = shard_slot(s, v, &at, fn))) return st;
    }
    const char **keys = malloc((nk ? nk : 1) * sizeof *keys);
    if (!keys) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    nk = 0;
    for (const cJSON *e = wm->child; e; e = e->next) keys[nk++] = e->string ? e->string : "";
    qsort(keys, nk, sizeof *keys, cmp_str_ptr);
    for (size_t i = 1; i < nk && !st; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0)
            st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: '%.300s': tensor \"%.200s\" appears twice in \"weight_map\"", fn, path, keys[i]);
    free(keys);
    return st;
}

/* Where the weights of `path` are: a directory holding model.safetensors or the index, an index
 * file (*.index.json) or one safetensors file. *index = 1 for an index; out gets the file path. */
static fp4rl_status resolve(const char *path, char *out, size_t cap, int *index, const char *fn)
{
    struct stat sb;
    if (stat(path, &sb) != 0) return fp4rl_fail(FP4RL_ERR_IO, "%s: cannot open '%.300s': %s", fn, path, strerror(errno));
    *index = 0;
    if (S_ISDIR(sb.st_mode)) {
        for (int k = 0; k < 2; k++) {
            if ((size_t)snprintf(out, cap, "%s/%s", path, k ? INDEX_NAME : SINGLE_NAME) >= cap)
                return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: path '%.300s' is too long", fn, path);
            if (lstat(out, &sb) == 0 || errno != ENOENT) {
                *index = k;
                return FP4RL_OK; /* opened (and refused unless regular) by the reader */
            }
        }
        return fp4rl_fail(FP4RL_ERR_IO, "%s: '%.300s' holds neither %s nor %s", fn, path, SINGLE_NAME, INDEX_NAME);
    }
    if ((size_t)snprintf(out, cap, "%s", path) >= cap)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: path '%.300s' is too long", fn, path);
    *index = ends_with(path, ".index.json");
    return FP4RL_OK;
}

/* Opens every file and checks every parameter against the file that should hold it. */
static fp4rl_status open_all(shards *s, const fp4rl_model *m, const char *file, int index, const char *fn)
{
    fp4rl_status st;
    char dir[4096], p[4352];
    snprintf(dir, sizeof dir, "%s", file);
    char *slash = strrchr(dir, '/');
    if (slash) slash[1] = 0;
    else dir[0] = 0;
    if (index) {
        if ((st = read_index(s, file, fn))) return st;
    } else {
        int at;
        if ((st = shard_slot(s, file, &at, fn))) return st;
    }
    for (int i = 0; i < s->n; i++) {
        snprintf(p, sizeof p, "%s%s", index ? dir : "", s->name[i]);
        if ((st = fp4rl_st_open_path(&s->f[i], p))) return wrap(st, fn, NULL);
    }
    for (int i = 0; i < m->n_params; i++) {
        const fp4rl_param *q = &m->params[i];
        int at = 0;
        if (index) {
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(s->weight_map, q->name);
            if (!e) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: '%.300s': tensor %s is not in \"weight_map\"", fn, file, q->name);
            shard_slot(s, e->valuestring, &at, fn); /* present: every value was added */
        }
        st = fp4rl_st_check_f32(s->f[at], q->name, q->ndim, q->dims);
        if (st) return wrap(st == FP4RL_ERR_DTYPE ? FP4RL_ERR_CORRUPT : st, fn, NULL);
    }
    /* An index that names a tensor its shard lacks is inconsistent, even one fp4rl does not use. */
    for (const cJSON *e = s->weight_map ? s->weight_map->child : NULL; e; e = e->next) {
        int at = 0;
        shard_slot(s, e->valuestring, &at, fn);
        if (!fp4rl_st_find(s->f[at], e->string))
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: '%.300s': \"weight_map\" puts tensor %.200s in %s, which lacks it", fn, file,
                              e->string, e->valuestring);
    }
    return FP4RL_OK;
}

fp4rl_status fp4rl_model_load(fp4rl_model *m, const char *path)
{
    const char *fn = "fp4rl_model_load";
    if (!m) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: model is NULL", fn);
    fp4rl_status st = fp4rl_check_ctx(m->ctx, fn);
    if (st) return st;
    if (!path) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: path is NULL", fn);
    char file[4096];
    int index = 0;
    if ((st = resolve(path, file, sizeof file, &index, fn))) return st;
    shards s = {0};
    st = open_all(&s, m, file, index, fn);
    int64_t most = 0;
    for (int i = 0; i < m->n_params; i++) most = m->params[i].numel > most ? m->params[i].numel : most;
    float *stage = st ? NULL : malloc((size_t)most * sizeof(float));
    if (!st && !stage) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    for (int i = 0; !st && i < m->n_params; i++) {
        const fp4rl_param *q = &m->params[i];
        int at = 0;
        if (index) shard_slot(&s, cJSON_GetObjectItemCaseSensitive(s.weight_map, q->name)->valuestring, &at, fn);
        st = fp4rl_st_read_f32(s.f[at], q->name, q->ndim, q->dims, stage);
        if (!st) st = m->ctx->be->upload(m->ctx, m->w + q->offset, stage, (size_t)q->numel * sizeof(float));
    }
    if (!st) st = fp4rl_model_reset_optimizer(m);
    free(stage);
    shards_free(&s);
    return st;
}

/* eos_token_id of a JSON object: an int or a list of ints, each a token id of the vocabulary.
 * *n = 0 when absent or null. */
static fp4rl_status eos_ids(const cJSON *root, int64_t vocab, int32_t *ids, int *n, const char *src, const char *fn)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    *n = 0;
    if (!e || cJSON_IsNull(e)) return FP4RL_OK;
    const cJSON *one = cJSON_IsArray(e) ? e->child : e;
    for (; one; one = cJSON_IsArray(e) ? one->next : NULL) {
        if (*n >= FP4RL_HF_MAX_EOS)
            return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: %s: \"eos_token_id\" lists more than %d ids", fn, src, FP4RL_HF_MAX_EOS);
        double d = cJSON_IsNumber(one) ? one->valuedouble : -1;
        if (!(d >= 0 && d < (double)vocab) || d != (double)(int32_t)d)
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"eos_token_id\" has an entry that is not a token id (0..%lld)", fn, src,
                              (long long)vocab - 1);
        ids[(*n)++] = (int32_t)d;
    }
    return FP4RL_OK;
}

/* The default stop tokens: generation_config.json's eos ids when that file exists and has them,
 * else config.json's. */
static fp4rl_status default_stops(fp4rl_model *m, const char *dir, const char *fn)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    struct stat sb;
    int n = 0;
    if (lstat(p, &sb) == 0 || errno != ENOENT) {
        uint8_t *buf = NULL;
        size_t len = 0;
        fp4rl_status st = fp4rl_read_file(p, MAX_JSON, &buf, &len, fn);
        if (st) return st;
        cJSON *root = cJSON_ParseWithLength((const char *)buf, len);
        free(buf);
        if (!cJSON_IsObject(root)) {
            cJSON_Delete(root);
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: '%.300s': not a JSON object", fn, p);
        }
        st = eos_ids(root, m->cfg.vocab_size, m->default_stop, &n, p, fn);
        cJSON_Delete(root);
        if (st) return st;
    }
    if (!n)
        for (int i = 0; i < m->cfg.n_eos; i++) m->default_stop[n++] = (int32_t)m->cfg.eos_token_id[i];
    m->n_default_stop = n;
    return FP4RL_OK;
}

fp4rl_status fp4rl_model_from_pretrained(fp4rl_model **out, fp4rl_context *ctx, const char *dir, const fp4rl_quant_policy *policy)
{
    const char *fn = "fp4rl_model_from_pretrained";
    if (!out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    fp4rl_status st = fp4rl_check_ctx(ctx, fn);
    if (st) return st;
    if (!dir) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: dir is NULL", fn);
    struct stat sb;
    if (stat(dir, &sb) != 0) return fp4rl_fail(FP4RL_ERR_IO, "%s: cannot open '%.300s': %s", fn, dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return fp4rl_fail(FP4RL_ERR_IO, "%s: '%.300s' is not a directory", fn, dir);
    char p[4200];
    if ((size_t)snprintf(p, sizeof p, "%s/config.json", dir) >= sizeof p)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: dir '%.300s' is too long", fn, dir);
    uint8_t *text = NULL;
    size_t len = 0;
    if ((st = fp4rl_read_file(p, (size_t)16 << 20, &text, &len, fn))) return st;
    fp4rl_model *m = NULL;
    st = strlen((const char *)text) == len ? fp4rl_model_create_ex(&m, ctx, (const char *)text, policy, 0, 0, fn)
                                           : fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: '%.300s' has a NUL byte", fn, p);
    free(text);
    if (st) return st == FP4RL_ERR_CORRUPT || st == FP4RL_ERR_UNSUPPORTED ? wrap(st, fn, p) : st;
    if (!st) st = fp4rl_model_load(m, dir);
    if (!st) st = default_stops(m, dir, fn);
    if (st) {
        fp4rl_model_destroy(m);
        return st;
    }
    *out = m;
    return FP4RL_OK;
}

/* ---- save_pretrained ------------------------------------------------------------------------- */

#define PRETRAINED_MARKER ".fp4rl-pretrained"

static fp4rl_status write_text(const char *dir, const char *name, const char *text, const char *fn)
{
    char p[4352];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wx");
    size_t n = strlen(text);
    if (!f || fwrite(text, 1, n, f) != n || fclose(f) != 0) {
        int e = errno;
        return fp4rl_fail(FP4RL_ERR_IO, "%s: cannot write '%.300s': %s", fn, p, strerror(e));
    }
    return FP4RL_OK;
}

/* {"eos_token_id": id or [ids], "bos_token_id": id} for generation_config.json. */
static char *generation_json(const fp4rl_model *m)
{
    cJSON *root = cJSON_CreateObject();
    int n = m->n_default_stop;
    int32_t ids[FP4RL_HF_MAX_EOS];
    if (n) memcpy(ids, m->default_stop, (size_t)n * sizeof *ids);
    else
        for (; n < m->cfg.n_eos; n++) ids[n] = (int32_t)m->cfg.eos_token_id[n];
    if (root && m->cfg.bos_token_id >= 0) cJSON_AddNumberToObject(root, "bos_token_id", (double)m->cfg.bos_token_id);
    if (root && n == 1) cJSON_AddNumberToObject(root, "eos_token_id", ids[0]);
    if (root && n > 1) cJSON_AddItemToObject(root, "eos_token_id", cJSON_CreateIntArray(ids, n));
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    return text;
}

fp4rl_status fp4rl_model_save_pretrained(const fp4rl_model *m, const char *dir, fp4rl_dtype dtype, size_t max_shard_bytes)
{
    const char *fn = "fp4rl_model_save_pretrained";
    if (!m) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: model is NULL", fn);
    fp4rl_status st = fp4rl_check_ctx(m->ctx, fn);
    if (st) return st;
    if (!dir || !*dir) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: dir is NULL or empty", fn);
    if (dtype != FP4RL_DTYPE_F32 && dtype != FP4RL_DTYPE_BF16)
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: weights are saved as f32 or bf16, not %s", fn, fp4rl_dtype_name(dtype));
    const size_t esize = dtype == FP4RL_DTYPE_BF16 ? 2 : 4, bytes = (size_t)m->total * sizeof(float);
    /* Shards in parameter order, a new one when the next tensor would pass max_shard_bytes (a
     * tensor larger than the limit gets a shard of its own, as transformers does). */
    int *shard_of = malloc((size_t)m->n_params * sizeof *shard_of);
    float *host = malloc(bytes ? bytes : 1);
    fp4rl_st_write_entry *e = calloc((size_t)m->n_params, sizeof *e);
    char *tmp = NULL, *cfg_text = NULL, *gen_text = NULL, *idx_text = NULL;
    cJSON *idx = NULL;
    if (!shard_of || !host || !e) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    int n_shards = 1;
    size_t in_shard = 0;
    for (int i = 0; !st && i < m->n_params; i++) {
        const size_t b = (size_t)m->params[i].numel * esize;
        if (max_shard_bytes && in_shard && in_shard + b > max_shard_bytes) {
            n_shards++;
            in_shard = 0;
        }
        in_shard += b;
        shard_of[i] = n_shards - 1;
    }
    if (!st) st = fp4rl_hf_config_to_json(&m->cfg, &cfg_text);
    if (!st) st = m->ctx->be->download(m->ctx, host, m->w, bytes);
    if (!st && !(gen_text = generation_json(m))) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (!st) st = fp4rl_dir_stage(dir, PRETRAINED_MARKER, &tmp, fn);
    if (!st) st = write_text(tmp, "config.json", cfg_text, fn);
    if (!st && (m->n_default_stop || m->cfg.n_eos)) st = write_text(tmp, "generation_config.json", gen_text, fn);
    cJSON *wm = NULL;
    if (!st && n_shards > 1) {
        idx = cJSON_CreateObject();
        cJSON *meta = cJSON_AddObjectToObject(idx, "metadata");
        wm = cJSON_AddObjectToObject(idx, "weight_map");
        if (!meta || !wm || !cJSON_AddNumberToObject(meta, "total_size", (double)((size_t)m->total * esize)))
            st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    const fp4rl_st_kv meta[1] = {{"format", "pt"}};
    for (int s = 0, i0 = 0; !st && s < n_shards; s++) {
        char name[64], p[4352];
        if (n_shards > 1) snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        else snprintf(name, sizeof name, "%s", SINGLE_NAME);
        int n = 0;
        for (int i = i0; i < m->n_params && shard_of[i] == s; i++, n++) {
            const fp4rl_param *q = &m->params[i];
            e[n] = (fp4rl_st_write_entry){q->name, FP4RL_DTYPE_F32, q->ndim, q->dims, host + q->offset, dtype == FP4RL_DTYPE_BF16};
            if (wm && !cJSON_AddStringToObject(wm, q->name, name)) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        }
        i0 += n;
        snprintf(p, sizeof p, "%s/%s", tmp, name);
        if (!st && (st = fp4rl_st_write_path(p, e, (size_t)n, meta, 1))) st = wrap(st, fn, NULL);
    }
    if (!st && idx && !(idx_text = cJSON_Print(idx))) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (!st && idx_text) st = write_text(tmp, INDEX_NAME, idx_text, fn);
    if (!st) {
        st = fp4rl_dir_commit(tmp, dir, PRETRAINED_MARKER, fn);
        tmp = NULL;
    }
    fp4rl_dir_abort(tmp);
    cJSON_Delete(idx);
    cJSON_free(idx_text);
    cJSON_free(gen_text);
    free(cfg_text);
    free(shard_of);
    free(host);
    free(e);
    return st;
}

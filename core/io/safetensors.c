/* safetensors.c - the safetensors reader (validates everything) and the atomic writer. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/formats.h"
#include "io/json.h"
#include "io/safetensors.h"

/* Numbers in a header must be below 2^53, so that the double cJSON keeps is the exact integer. */
#define ST_MAX_INT 9007199254740992.0

/* ---- small helpers -------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} st_dtypes[FP4RL_ST_DTYPE_COUNT] = {
    [FP4RL_ST_BOOL] = {"BOOL", 1},       [FP4RL_ST_U8] = {"U8", 1},   [FP4RL_ST_I8] = {"I8", 1},
    [FP4RL_ST_F8_E5M2] = {"F8_E5M2", 1}, [FP4RL_ST_F8_E4M3] = {"F8_E4M3", 1},
    [FP4RL_ST_I16] = {"I16", 2},         [FP4RL_ST_U16] = {"U16", 2}, [FP4RL_ST_F16] = {"F16", 2},
    [FP4RL_ST_BF16] = {"BF16", 2},       [FP4RL_ST_I32] = {"I32", 4}, [FP4RL_ST_U32] = {"U32", 4},
    [FP4RL_ST_F32] = {"F32", 4},         [FP4RL_ST_F64] = {"F64", 8}, [FP4RL_ST_I64] = {"I64", 8},
    [FP4RL_ST_U64] = {"U64", 8},
};

const char *fp4rl_st_dtype_name(fp4rl_st_dtype dt)
{
    return (unsigned)dt < FP4RL_ST_DTYPE_COUNT ? st_dtypes[dt].name : "?";
}

size_t fp4rl_st_dtype_size(fp4rl_st_dtype dt) { return (unsigned)dt < FP4RL_ST_DTYPE_COUNT ? st_dtypes[dt].size : 0; }

static bool st_dtype_lookup(const char *s, fp4rl_st_dtype *out)
{
    for (int i = 0; i < FP4RL_ST_DTYPE_COUNT; i++)
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = (fp4rl_st_dtype)i;
            return true;
        }
    return false;
}

static const char *errtext(int e, char *buf, size_t n)
{
    if (strerror_r(e, buf, n) != 0) snprintf(buf, n, "errno %d", e);
    return buf;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* IEEE binary16 to binary32, exact (subnormals, infinities and NaN payloads included). */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)man * 0x1p-24f; /* man < 2^10: exact */
        return sign ? -v : v;
    }
    uint32_t bits = exp == 31 ? sign | 0x7f800000u | man << 13 : sign | (exp + 112u) << 23 | man << 13;
    return fp4rl_bits_f32(bits);
}

int fp4rl_utf8_valid(const uint8_t *s, size_t n, size_t *bad_at)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1fu, min = 0x80;
        else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0fu, min = 0x800;
        else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07u, min = 0x10000;
        else goto bad;
        if (n - i < len) goto bad;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) goto bad;
            cp = cp << 6 | (s[i + k] & 0x3fu);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) goto bad;
        i += len;
    }
    return 1;
bad:
    if (bad_at) *bad_at = i;
    return 0;
}

fp4rl_status fp4rl_open_regular(const char *path, int *fd_out, size_t *size_out, const char *fn)
{
    char eb[128];
    if (!path || !fd_out || !size_out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: path or an output is NULL", fn);
    /* O_NONBLOCK: opening a FIFO nobody writes returns at once instead of waiting for a writer;
     * fstat on the descriptor then refuses it (no race between a stat and the open). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return fp4rl_fail(FP4RL_ERR_IO, "%s: cannot open '%.300s': %s", fn, path, errtext(errno, eb, sizeof eb));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return fp4rl_fail(FP4RL_ERR_IO, "%s: cannot stat '%.300s': %s", fn, path, errtext(e, eb, sizeof eb));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return fp4rl_fail(FP4RL_ERR_IO, "%s: '%.300s' is not a regular file", fn, path);
    }
    if (sb.st_size < 0 || (uintmax_t)sb.st_size >= (uintmax_t)SIZE_MAX) {
        close(fd);
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: '%.300s' has size %lld", fn, path, (long long)sb.st_size);
    }
    *fd_out = fd;
    *size_out = (size_t)sb.st_size;
    return FP4RL_OK;
}

fp4rl_status fp4rl_read_file(const char *path, size_t max_bytes, uint8_t **out, size_t *len, const char *fn)
{
    char eb[128];
    if (!path || !out || !len) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: path or an output is NULL", fn);
    int fd = -1;
    size_t size = 0;
    fp4rl_status ost = fp4rl_open_regular(path, &fd, &size, fn);
    if (ost) return ost;
    if (size > max_bytes) {
        close(fd);
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: '%.300s' is %zu bytes; at most %zu are accepted", fn, path, size, max_bytes);
    }
    size_t n = size, got = 0;
    uint8_t *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory reading '%.300s' (%zu bytes)", fn, path, n);
    }
    while (got < n) {
        size_t chunk = n - got > (size_t)1 << 30 ? (size_t)1 << 30 : n - got;
        ssize_t r = read(fd, buf + got, chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            free(buf);
            close(fd);
            if (r == 0) return fp4rl_fail(FP4RL_ERR_IO, "%s: '%.300s' became shorter while it was read", fn, path);
            return fp4rl_fail(FP4RL_ERR_IO, "%s: cannot read '%.300s': %s", fn, path, errtext(e, eb, sizeof eb));
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    *len = n;
    return FP4RL_OK;
}

/* ---- reader --------------------------------------------------------------------------------- */

struct fp4rl_st {
    void *map;             /* the file's mapping when opened from a path (else NULL: borrowed) */
    size_t map_len;
    const uint8_t *data;   /* the data section */
    size_t data_len;
    cJSON *root;           /* the parsed header: names and metadata point into it */
    fp4rl_st_tensor *t;    /* sorted by name */
    size_t n;
    fp4rl_st_kv *meta;     /* sorted by key */
    size_t n_meta;
    char src[160];         /* the path, or "buffer", for messages */
};

/* An exact integer in [0, 2^53); otherwise false and *why says what is wrong. */
static bool json_uint(const cJSON *j, uint64_t *v, const char **why)
{
    if (!cJSON_IsNumber(j)) {
        *why = "is not a number";
        return false;
    }
    double d = j->valuedouble;
    if (isnan(d) || isinf(d)) *why = "is out of range";
    else if (d < 0) *why = "is negative";
    else if (d != floor(d)) *why = "is not an integer";
    else if (d >= ST_MAX_INT) *why = "is 2^53 or more";
    else {
        *v = (uint64_t)d;
        return true;
    }
    return false;
}

/* What a lexical pass over the header text found: "\u0000" escapes (cJSON would cut the string
 * there), and numbers not spelled as plain non-negative integers ("1.0", "1e3", "-0", "01"), which
 * cJSON's doubles cannot tell apart from the integers they equal. `key` is the top-level key the
 * first bad number sits under. */
typedef struct lexinfo {
    bool nul_escape;
    size_t nul_at;
    bool bad_number;
    size_t num_at, num_len, key_at, key_len;
} lexinfo;

static void lex_scan(const char *s, size_t n, lexinfo *r)
{
    memset(r, 0, sizeof *r);
    int depth = 0;
    size_t key_at = 0, key_len = 0;
    size_t i = 0;
    while (i < n) {
        char c = s[i];
        if (c == '"') {
            size_t start = ++i;
            while (i < n && s[i] != '"') {
                if (s[i] == '\\') {
                    if (!r->nul_escape && i + 5 < n && s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0) {
                        r->nul_escape = true;
                        r->nul_at = i;
                    }
                    i += 2;
                } else {
                    i++;
                }
            }
            if (i > n) i = n;
            if (depth == 1) key_at = start, key_len = i - start;
            i++;
            continue;
        }
        if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t start = i;
            bool ok = true;
            while (i < n && strchr("0123456789+-.eE", s[i]) && s[i]) {
                if (s[i] < '0' || s[i] > '9') ok = false;
                i++;
            }
            if (i - start > 1 && s[start] == '0') ok = false;
            if (!ok && !r->bad_number) {
                r->bad_number = true;
                r->num_at = start;
                r->num_len = i - start;
                r->key_at = key_at;
                r->key_len = key_len;
            }
            continue;
        }
        i++;
    }
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const fp4rl_st_tensor *)a)->name, ((const fp4rl_st_tensor *)b)->name);
}
static int cmp_kv_key(const void *a, const void *b) { return strcmp(((const fp4rl_st_kv *)a)->key, ((const fp4rl_st_kv *)b)->key); }
static int cmp_tensor_offset(const void *a, const void *b)
{
    const fp4rl_st_tensor *x = *(const fp4rl_st_tensor *const *)a, *y = *(const fp4rl_st_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Checks a name read from a file or given to the writer: 1..FP4RL_ST_MAX_NAME bytes, no control
 * characters. On failure writes the reason into why. */
static bool name_ok(const char *name, char *why, size_t why_n)
{
    size_t len = strlen(name);
    if (len == 0) {
        snprintf(why, why_n, "a tensor name is empty");
        return false;
    }
    if (len > FP4RL_ST_MAX_NAME) {
        snprintf(why, why_n, "the tensor name beginning '%.40s' is %zu bytes; at most %d are allowed", name, len, FP4RL_ST_MAX_NAME);
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c < 0x20 || c == 0x7f) {
            snprintf(why, why_n, "the tensor name beginning '%.*s' has control character 0x%02x at byte %zu",
                     (int)(i < 40 ? i : 40), name, c, i);
            return false;
        }
    }
    return true;
}

/* Parses one entry {"dtype", "shape", "data_offsets"} into t (name already set). */
static fp4rl_status parse_entry(fp4rl_st *f, const cJSON *e, fp4rl_st_tensor *t, const char *fn)
{
    const char *src = f->src, *nm = t->name, *why = "";
    if (!cJSON_IsObject(e))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': the entry is a JSON %s, not an object", fn, src, nm, fp4rl_json_type(e));
    const cJSON *jd = NULL, *js = NULL, *jo = NULL;
    for (const cJSON *k = e->child; k; k = k->next) {
        const cJSON **slot = !k->string ? NULL
                             : strcmp(k->string, "dtype") == 0 ? &jd
                             : strcmp(k->string, "shape") == 0 ? &js
                             : strcmp(k->string, "data_offsets") == 0 ? &jo : NULL;
        if (!slot) continue; /* unknown fields are ignored, as the reference does */
        if (*slot)
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': field \"%s\" appears twice", fn, src, nm, k->string);
        *slot = k;
    }
    if (!jd || !js || !jo)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': the entry has no \"%s\"", fn, src, nm,
                          !jd ? "dtype" : !js ? "shape" : "data_offsets");
    /* dtype */
    if (!cJSON_IsString(jd))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': dtype is a JSON %s, not a string", fn, src, nm, fp4rl_json_type(jd));
    if (!st_dtype_lookup(jd->valuestring, &t->dtype))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': unknown dtype \"%.40s\"", fn, src, nm, jd->valuestring);
    /* shape */
    if (!cJSON_IsArray(js))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': shape is a JSON %s, not an array", fn, src, nm, fp4rl_json_type(js));
    int nd = 0;
    bool zero = false;
    for (const cJSON *d = js->child; d; d = d->next, nd++) {
        if (nd >= FP4RL_ST_MAX_DIMS)
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': shape has more than %d dims", fn, src, nm, FP4RL_ST_MAX_DIMS);
        uint64_t v;
        if (!json_uint(d, &v, &why))
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': shape[%d] %s", fn, src, nm, nd, why);
        t->shape[nd] = (int64_t)v;
        zero |= v == 0;
    }
    t->ndim = nd;
    uint64_t numel = 1;
    if (zero) {
        numel = 0;
    } else {
        for (int i = 0; i < nd; i++) {
            uint64_t d = (uint64_t)t->shape[i];
            if (numel > (uint64_t)INT64_MAX / 8 / d)
                return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': the element count of its shape overflows", fn, src, nm);
            numel *= d;
        }
    }
    t->numel = (int64_t)numel;
    uint64_t nbytes = numel * fp4rl_st_dtype_size(t->dtype); /* numel <= INT64_MAX / 8: no overflow */
    /* data_offsets */
    if (!cJSON_IsArray(jo))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': data_offsets is a JSON %s, not an array", fn, src, nm, fp4rl_json_type(jo));
    const cJSON *jb = jo->child, *je = jb ? jb->next : NULL;
    if (!jb || !je || je->next)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': data_offsets must have exactly 2 elements", fn, src, nm);
    uint64_t b, en;
    if (!json_uint(jb, &b, &why))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': data_offsets[0] %s", fn, src, nm, why);
    if (!json_uint(je, &en, &why))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': data_offsets[1] %s", fn, src, nm, why);
    if (b > en)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': data_offsets [%llu, %llu] run backwards", fn, src, nm,
                          (unsigned long long)b, (unsigned long long)en);
    if (en > f->data_len)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': data_offsets [%llu, %llu] run past the data section (%zu bytes)",
                          fn, src, nm, (unsigned long long)b, (unsigned long long)en, f->data_len);
    if (en - b != nbytes) {
        char sb[160];
        fp4rl_shape_str(sb, sizeof sb, nd, t->shape);
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.200s': shape %s of %s is %llu bytes, but data_offsets [%llu, %llu] hold %llu",
                          fn, src, nm, sb, fp4rl_st_dtype_name(t->dtype), (unsigned long long)nbytes, (unsigned long long)b,
                          (unsigned long long)en, (unsigned long long)(en - b));
    }
    t->offset = b;
    t->nbytes = (size_t)nbytes;
    t->data = f->data + b;
    return FP4RL_OK;
}

static fp4rl_status parse_metadata(fp4rl_st *f, const cJSON *m, const char *fn)
{
    if (!cJSON_IsObject(m))
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"__metadata__\" is a JSON %s, not an object", fn, f->src, fp4rl_json_type(m));
    size_t n = 0;
    for (const cJSON *k = m->child; k; k = k->next) n++;
    f->meta = calloc(n ? n : 1, sizeof *f->meta);
    if (!f->meta) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (const cJSON *k = m->child; k; k = k->next) {
        if (!k->string) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: a \"__metadata__\" entry has no key", fn, f->src);
        if (!cJSON_IsString(k))
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"__metadata__\" key '%.200s': the value is a JSON %s, not a string",
                              fn, f->src, k->string, fp4rl_json_type(k));
        f->meta[f->n_meta].key = k->string;
        f->meta[f->n_meta].value = k->valuestring;
        f->n_meta++;
    }
    qsort(f->meta, f->n_meta, sizeof *f->meta, cmp_kv_key);
    for (size_t i = 1; i < f->n_meta; i++)
        if (strcmp(f->meta[i - 1].key, f->meta[i].key) == 0)
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"__metadata__\" key '%.200s' appears twice", fn, f->src, f->meta[i].key);
    return FP4RL_OK;
}

/* The header has been parsed into f->root; checks every entry and the tiling of the data. */
static fp4rl_status parse_tree(fp4rl_st *f, const char *fn)
{
    const char *src = f->src;
    const cJSON *root = f->root, *meta = NULL;
    if (!cJSON_IsObject(root)) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: the header is a JSON %s, not an object", fn, src, fp4rl_json_type(root));
    size_t count = 0;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (!c->string) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: a header entry has no key", fn, src);
        if (strcmp(c->string, "__metadata__") == 0) {
            if (meta) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: \"__metadata__\" appears twice", fn, src);
            meta = c;
        } else {
            count++;
        }
    }
    if (meta) {
        fp4rl_status st = parse_metadata(f, meta, fn);
        if (st) return st;
    }
    f->t = calloc(count ? count : 1, sizeof *f->t);
    if (!f->t) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory (%zu tensors)", fn, count);
    char why[200];
    for (const cJSON *c = root->child; c; c = c->next) {
        if (c == meta) continue;
        if (!name_ok(c->string, why, sizeof why)) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: %s", fn, src, why);
        fp4rl_st_tensor *t = &f->t[f->n];
        t->name = c->string;
        fp4rl_status st = parse_entry(f, c, t, fn);
        if (st) return st;
        f->n++;
    }
    qsort(f->t, f->n, sizeof *f->t, cmp_tensor_name);
    for (size_t i = 1; i < f->n; i++)
        if (strcmp(f->t[i - 1].name, f->t[i].name) == 0)
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor name '%.200s' appears twice", fn, src, f->t[i].name);

    /* The tensors must tile the data section: sorted by offset, each begins where the last ended. */
    const fp4rl_st_tensor **by_off = malloc((f->n ? f->n : 1) * sizeof *by_off);
    if (!by_off) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (size_t i = 0; i < f->n; i++) by_off[i] = &f->t[i];
    qsort(by_off, f->n, sizeof *by_off, cmp_tensor_offset);
    uint64_t cursor = 0;
    const fp4rl_st_tensor *prev = NULL;
    fp4rl_status st = FP4RL_OK;
    for (size_t i = 0; i < f->n && !st; i++) {
        const fp4rl_st_tensor *t = by_off[i];
        if (t->offset < cursor)
            st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensors '%.200s' and '%.200s' overlap in the data section (at byte %llu)",
                            fn, src, prev->name, t->name, (unsigned long long)t->offset);
        else if (t->offset > cursor)
            st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: bytes [%llu, %llu) of the data section belong to no tensor (a gap before '%.200s')",
                            fn, src, (unsigned long long)cursor, (unsigned long long)t->offset, t->name);
        cursor = t->offset + t->nbytes;
        prev = t;
    }
    free(by_off);
    if (st) return st;
    if (cursor != f->data_len)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: bytes [%llu, %zu) at the end of the data section belong to no tensor",
                          fn, src, (unsigned long long)cursor, f->data_len);
    return FP4RL_OK;
}

static bool json_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static fp4rl_status st_parse(fp4rl_st *f, const uint8_t *buf, size_t len, const char *fn)
{
    const char *src = f->src;
    if (len < 8)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: %zu bytes is too short; a safetensors file begins with an 8-byte header length", fn, src, len);
    uint64_t hn64 = le64(buf);
    if (hn64 < 2) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: the header length is %llu; the smallest header is \"{}\"", fn, src, (unsigned long long)hn64);
    if (hn64 > FP4RL_ST_MAX_HEADER)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: the header length %llu exceeds the limit of %u bytes", fn, src,
                          (unsigned long long)hn64, FP4RL_ST_MAX_HEADER);
    if (hn64 > len - 8)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: the header length %llu runs past the end of the file (%zu bytes follow the length)",
                          fn, src, (unsigned long long)hn64, len - 8);
    size_t hn = (size_t)hn64;
    const uint8_t *h = buf + 8;
    f->data = h + hn;
    f->data_len = len - 8 - hn;
    if (h[0] != '{') return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: the header does not begin with '{'", fn, src);
    size_t bad;
    if (!fp4rl_utf8_valid(h, hn, &bad)) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: the header is not valid UTF-8 (at byte %zu)", fn, src, bad);
    for (size_t i = 0; i < hn; i++)
        if (h[i] < 0x20 && !json_ws((char)h[i]))
            return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: the header has control byte 0x%02x at byte %zu", fn, src, h[i], i);

    /* cJSON gets a NUL-terminated copy: it never has to stop exactly at the buffer's end. */
    char *text = malloc(hn + 1);
    if (!text) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory (header of %zu bytes)", fn, hn);
    memcpy(text, h, hn);
    text[hn] = 0;
    lexinfo lx;
    lex_scan(text, hn, &lx);
    fp4rl_status st = FP4RL_OK;
    const char *end = NULL;
    if (lx.nul_escape) {
        st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: the header has a \\u0000 escape in a string (at byte %zu)", fn, src, lx.nul_at);
        goto out;
    }
    f->root = cJSON_ParseWithLengthOpts(text, hn, &end, 0);
    if (!f->root) {
        size_t at = end && end >= text && end <= text + hn ? (size_t)(end - text) : 0;
        st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: the header is not valid JSON (error near byte %zu)", fn, src, at);
        goto out;
    }
    for (const char *p = end; p < text + hn; p++)
        if (!json_ws(*p)) {
            st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: the header has bytes after its JSON object (at byte %zu)", fn, src, (size_t)(p - text));
            goto out;
        }
    st = parse_tree(f, fn);
    if (!st && lx.bad_number)
        st = fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %s: tensor '%.*s': the number '%.*s' in its entry is not written as a plain non-negative integer",
                        fn, src, (int)(lx.key_len < 200 ? lx.key_len : 200), text + lx.key_at,
                        (int)(lx.num_len < 40 ? lx.num_len : 40), text + lx.num_at);
out:
    free(text);
    return st;
}

static fp4rl_status st_open(fp4rl_st **out, const uint8_t *buf, size_t len, void *map, const char *src, const char *fn)
{
    fp4rl_st *f = calloc(1, sizeof *f);
    if (!f) {
        if (map) munmap(map, len);
        return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    f->map = map;
    f->map_len = map ? len : 0;
    snprintf(f->src, sizeof f->src, "%s", src);
    fp4rl_status st = st_parse(f, buf, len, fn);
    if (st) {
        fp4rl_st_close(f);
        return st;
    }
    *out = f;
    return FP4RL_OK;
}

fp4rl_status fp4rl_st_open_mem(fp4rl_st **out, const void *buf, size_t len)
{
    const char *fn = "fp4rl_st_open_mem";
    if (!out || (!buf && len)) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out or buf is NULL", fn);
    return st_open(out, buf, len, NULL, "buffer", fn);
}

fp4rl_status fp4rl_st_open_path(fp4rl_st **out, const char *path)
{
    const char *fn = "fp4rl_st_open_path";
    char eb[128];
    if (!out || !path) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out or path is NULL", fn);
    int fd = -1;
    size_t len = 0;
    fp4rl_status st = fp4rl_open_regular(path, &fd, &len, fn);
    if (st) return st;
    /* Mapped, not read: the tensors are copied from the page cache straight into their device
     * buffers, with no second full copy of the file in host memory. MAP_PRIVATE + PROT_READ: a
     * writer changing the file later can change what we read, but never our memory's safety
     * beyond the mapping (the header is validated once; a file truncated under us can SIGBUS,
     * as with every mmap'ing reader, safetensors' own included). */
    void *map = NULL;
    if (len) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return fp4rl_fail(FP4RL_ERR_IO, "%s: cannot map '%.300s': %s", fn, path, errtext(e, eb, sizeof eb));
        }
    }
    close(fd);
    char src[160];
    snprintf(src, sizeof src, "'%s'", path);
    static const uint8_t empty[1];
    return st_open(out, map ? (const uint8_t *)map : empty, len, map, src, fn);
}

void fp4rl_st_close(fp4rl_st *f)
{
    if (!f) return;
    cJSON_Delete(f->root);
    free(f->t);
    free(f->meta);
    if (f->map) munmap(f->map, f->map_len);
    free(f);
}

size_t fp4rl_st_count(const fp4rl_st *f) { return f ? f->n : 0; }
const fp4rl_st_tensor *fp4rl_st_at(const fp4rl_st *f, size_t i) { return f && i < f->n ? &f->t[i] : NULL; }

const fp4rl_st_tensor *fp4rl_st_find(const fp4rl_st *f, const char *name)
{
    if (!f || !name) return NULL;
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->t[mid].name);
        if (c == 0) return &f->t[mid];
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

size_t fp4rl_st_metadata_count(const fp4rl_st *f) { return f ? f->n_meta : 0; }

int fp4rl_st_metadata_at(const fp4rl_st *f, size_t i, const char **key, const char **value)
{
    if (!f || i >= f->n_meta) return 0;
    if (key) *key = f->meta[i].key;
    if (value) *value = f->meta[i].value;
    return 1;
}

const char *fp4rl_st_metadata(const fp4rl_st *f, const char *key)
{
    if (!f || !key) return NULL;
    fp4rl_st_kv probe = {key, NULL};
    const fp4rl_st_kv *kv = bsearch(&probe, f->meta, f->n_meta, sizeof *f->meta, cmp_kv_key);
    return kv ? kv->value : NULL;
}

fp4rl_status fp4rl_st_check_f32(const fp4rl_st *f, const char *name, int ndim, const int64_t *shape)
{
    const char *fn = "fp4rl_st_read_f32";
    if (!f || !name) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: the file or name is NULL", fn);
    if (ndim < 0 || ndim > FP4RL_ST_MAX_DIMS || (ndim && !shape))
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %.200s: the expected shape is invalid (ndim %d)", fn, name, ndim);
    const fp4rl_st_tensor *t = fp4rl_st_find(f, name);
    if (!t) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %.200s: no such tensor in %s", fn, name, f->src);
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char want[160], have[160];
        fp4rl_shape_str(want, sizeof want, ndim, shape);
        fp4rl_shape_str(have, sizeof have, t->ndim, t->shape);
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: %.200s: expected %s, file has %s (%s)", fn, name, want, have, f->src);
    }
    if (t->dtype != FP4RL_ST_F32 && t->dtype != FP4RL_ST_BF16 && t->dtype != FP4RL_ST_F16)
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: %.200s: dtype %s in %s; expected F32, BF16 or F16", fn, name,
                          fp4rl_st_dtype_name(t->dtype), f->src);
    return FP4RL_OK;
}

fp4rl_status fp4rl_st_read_f32(const fp4rl_st *f, const char *name, int ndim, const int64_t *shape, float *dst)
{
    if (!dst) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_st_read_f32: dst is NULL");
    fp4rl_status st = fp4rl_st_check_f32(f, name, ndim, shape);
    if (st) return st;
    const fp4rl_st_tensor *t = fp4rl_st_find(f, name);
    size_t n = (size_t)t->numel;
    const uint8_t *p = t->data;
    if (t->dtype == FP4RL_ST_F32)
        for (size_t i = 0; i < n; i++) dst[i] = fp4rl_bits_f32(le32(p + 4 * i));
    else if (t->dtype == FP4RL_ST_BF16)
        for (size_t i = 0; i < n; i++) dst[i] = fp4rl_bf16_to_f32(le16(p + 2 * i));
    else
        for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(le16(p + 2 * i));
    return FP4RL_OK;
}

/* ---- writer --------------------------------------------------------------------------------- */

static size_t entry_esize(const fp4rl_st_write_entry *e)
{
    return e->dtype == FP4RL_DTYPE_BF16 || e->store_bf16 ? 2 : 4;
}
static const char *entry_file_dtype(const fp4rl_st_write_entry *e)
{
    return e->dtype == FP4RL_DTYPE_I32 ? "I32" : entry_esize(e) == 2 ? "BF16" : "F32";
}

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp((*(const fp4rl_st_write_entry *const *)a)->name, (*(const fp4rl_st_write_entry *const *)b)->name);
}
/* Data order: larger elements first (so each tensor stays aligned to its element size), then name. */
static int cmp_entry_data(const void *a, const void *b)
{
    const fp4rl_st_write_entry *x = *(const fp4rl_st_write_entry *const *)a, *y = *(const fp4rl_st_write_entry *const *)b;
    size_t sx = entry_esize(x), sy = entry_esize(y);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}
static int cmp_kv_ptr(const void *a, const void *b)
{
    return strcmp((*(const fp4rl_st_kv *const *)a)->key, (*(const fp4rl_st_kv *const *)b)->key);
}

/* What the writer works from: the validated entries in name order and in data order, with their
 * byte sizes and offsets, and the metadata in key order. */
typedef struct plan {
    size_t n, n_meta;
    const fp4rl_st_write_entry *base;         /* the caller's array */
    const fp4rl_st_write_entry **by_name, **by_data;
    uint64_t *nbytes;        /* per entry (index into base) */
    uint64_t *offset;        /* per entry: where its bytes begin in the data section */
    const fp4rl_st_kv **meta;
    uint64_t data_bytes;
    uint8_t *prefix;         /* 8-byte length + padded header */
    size_t prefix_len;
} plan;

static void plan_free(plan *p)
{
    free(p->by_name);
    free(p->by_data);
    free(p->nbytes);
    free(p->offset);
    free(p->meta);
    free(p->prefix);
}

static bool utf8_str_ok(const char *s) { return fp4rl_utf8_valid((const uint8_t *)s, strlen(s), NULL); }

static fp4rl_status check_entries(plan *p, const fp4rl_st_write_entry *es, size_t n, const fp4rl_st_kv *meta, size_t n_meta,
                                  const char *fn)
{
    if (n && !es) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: entries is NULL", fn);
    if (n_meta && !meta) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: meta is NULL", fn);
    char why[200];
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const fp4rl_st_write_entry *e = &es[i];
        if (!e->name) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: entry %zu has a NULL name", fn, i);
        if (!name_ok(e->name, why, sizeof why)) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: entry %zu: %s", fn, i, why);
        if (!utf8_str_ok(e->name)) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: entry %zu: the name is not valid UTF-8", fn, i);
        if (strcmp(e->name, "__metadata__") == 0)
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: entry %zu: \"__metadata__\" cannot name a tensor", fn, i);
        if (e->dtype != FP4RL_DTYPE_F32 && e->dtype != FP4RL_DTYPE_BF16 && e->dtype != FP4RL_DTYPE_I32)
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: tensor '%.200s': dtype %s; the writer takes f32, bf16 or i32", fn,
                              e->name, fp4rl_dtype_name(e->dtype));
        if (e->store_bf16 && e->dtype != FP4RL_DTYPE_F32)
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: tensor '%.200s': store_bf16 needs f32 data, not %s", fn, e->name,
                              fp4rl_dtype_name(e->dtype));
        if (e->ndim < 0 || e->ndim > FP4RL_ST_MAX_DIMS || (e->ndim && !e->shape))
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: tensor '%.200s': ndim %d (0..%d) or a NULL shape", fn, e->name,
                              e->ndim, FP4RL_ST_MAX_DIMS);
        uint64_t numel = 1;
        bool zero = false;
        for (int d = 0; d < e->ndim; d++) {
            if (e->shape[d] < 0)
                return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: tensor '%.200s': dim %d is %lld", fn, e->name, d, (long long)e->shape[d]);
            zero |= e->shape[d] == 0;
        }
        for (int d = 0; d < e->ndim && !zero; d++) {
            uint64_t v = (uint64_t)e->shape[d];
            if (numel > (uint64_t)(ST_MAX_INT / 8) / v)
                return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: tensor '%.200s': the shape is too large", fn, e->name);
            numel *= v;
        }
        if (zero) numel = 0;
        uint64_t nb = numel * entry_esize(e);
        if (nb && !e->data) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: tensor '%.200s': data is NULL", fn, e->name);
        total += nb;
        if (total >= (uint64_t)ST_MAX_INT || total > (uint64_t)SIZE_MAX / 2)
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: the tensors are too large for one file", fn);
    }
    for (size_t i = 0; i < n_meta; i++) {
        if (!meta[i].key || !meta[i].value)
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: metadata pair %zu has a NULL key or value", fn, i);
        if (!utf8_str_ok(meta[i].key) || !utf8_str_ok(meta[i].value))
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: metadata '%.200s': not valid UTF-8", fn, meta[i].key);
    }
    p->base = es;
    p->n = n;
    p->n_meta = n_meta;
    p->data_bytes = total;
    p->by_name = malloc((n ? n : 1) * sizeof *p->by_name);
    p->by_data = malloc((n ? n : 1) * sizeof *p->by_data);
    p->nbytes = malloc((n ? n : 1) * sizeof *p->nbytes);
    p->offset = malloc((n ? n : 1) * sizeof *p->offset);
    p->meta = malloc((n_meta ? n_meta : 1) * sizeof *p->meta);
    if (!p->by_name || !p->by_data || !p->nbytes || !p->offset || !p->meta)
        return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (size_t i = 0; i < n; i++) p->by_name[i] = p->by_data[i] = &es[i];
    for (size_t i = 0; i < n_meta; i++) p->meta[i] = &meta[i];
    qsort(p->by_name, n, sizeof *p->by_name, cmp_entry_name);
    qsort(p->by_data, n, sizeof *p->by_data, cmp_entry_data);
    qsort(p->meta, n_meta, sizeof *p->meta, cmp_kv_ptr);
    for (size_t i = 1; i < n; i++)
        if (strcmp(p->by_name[i - 1]->name, p->by_name[i]->name) == 0)
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: tensor name '%.200s' appears twice", fn, p->by_name[i]->name);
    for (size_t i = 1; i < n_meta; i++)
        if (strcmp(p->meta[i - 1]->key, p->meta[i]->key) == 0)
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: metadata key '%.200s' appears twice", fn, p->meta[i]->key);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const fp4rl_st_write_entry *e = p->by_data[i];
        size_t k = (size_t)(e - es);
        uint64_t numel = 1;
        for (int d = 0; d < e->ndim; d++) numel *= (uint64_t)e->shape[d];
        p->nbytes[k] = numel * entry_esize(e);
        p->offset[k] = off;
        off += p->nbytes[k];
    }
    return FP4RL_OK;
}

/* A JSON integer as raw text: cJSON's own number printing rounds beyond 15 digits. */
static bool jadd_uint(cJSON *parent, const char *key, uint64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    return fp4rl_json_add(parent, key, cJSON_CreateRaw(buf));
}

static bool add_tensor_json(cJSON *root, const plan *p, const fp4rl_st_write_entry *e)
{
    size_t k = (size_t)(e - p->base);
    cJSON *o = cJSON_CreateObject();
    if (!fp4rl_json_add(root, e->name, o)) return false;
    cJSON *offs = cJSON_CreateArray();
    if (!fp4rl_json_add(o, "data_offsets", offs) || !jadd_uint(offs, NULL, p->offset[k]) || !jadd_uint(offs, NULL, p->offset[k] + p->nbytes[k]))
        return false;
    if (!fp4rl_json_add(o, "dtype", cJSON_CreateString(entry_file_dtype(e)))) return false;
    cJSON *shape = cJSON_CreateArray();
    if (!fp4rl_json_add(o, "shape", shape)) return false;
    for (int d = 0; d < e->ndim; d++)
        if (!jadd_uint(shape, NULL, (uint64_t)e->shape[d])) return false;
    return true;
}

/* Builds the 8-byte length and the header, keys sorted, padded with spaces to a multiple of 8. */
static fp4rl_status build_header(plan *p, const char *fn)
{
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL, meta_done = p->n_meta == 0;
    for (size_t i = 0; ok && i <= p->n; i++) {
        if (!meta_done && (i == p->n || strcmp("__metadata__", p->by_name[i]->name) < 0)) {
            cJSON *m = cJSON_CreateObject();
            ok = fp4rl_json_add(root, "__metadata__", m);
            for (size_t j = 0; ok && j < p->n_meta; j++) ok = fp4rl_json_add(m, p->meta[j]->key, cJSON_CreateString(p->meta[j]->value));
            meta_done = true;
        }
        if (ok && i < p->n) ok = add_tensor_json(root, p, p->by_name[i]);
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory building the header", fn);
    size_t jl = strlen(json), padded = (jl + 7) & ~(size_t)7;
    if (padded > FP4RL_ST_MAX_HEADER) {
        cJSON_free(json);
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: the header would be %zu bytes; the format allows %u", fn, padded, FP4RL_ST_MAX_HEADER);
    }
    p->prefix = malloc(8 + padded);
    if (!p->prefix) {
        cJSON_free(json);
        return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory building the header", fn);
    }
    for (int i = 0; i < 8; i++) p->prefix[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(p->prefix + 8, json, jl);
    memset(p->prefix + 8 + jl, ' ', padded - jl);
    p->prefix_len = 8 + padded;
    cJSON_free(json);
    return FP4RL_OK;
}

/* Where bytes go: a memory buffer, or a file descriptor through a staging buffer. */
typedef struct sink {
    uint8_t *mem;
    size_t pos;
    int fd;
    uint8_t *buf;
    size_t blen, bcap;
    int err;               /* errno of the first failed write */
} sink;

static bool write_all(int fd, const uint8_t *p, size_t n, int *err)
{
    while (n) {
        ssize_t r = write(fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            *err = r < 0 ? errno : EIO;
            return false;
        }
        p += r;
        n -= (size_t)r;
    }
    return true;
}

static bool sink_flush(sink *s)
{
    if (s->mem || s->err) return !s->err;
    bool ok = write_all(s->fd, s->buf, s->blen, &s->err);
    s->blen = 0;
    return ok;
}

static bool sink_put(sink *s, const uint8_t *p, size_t n)
{
    if (s->err) return false;
    if (s->mem) {
        memcpy(s->mem + s->pos, p, n);
        s->pos += n;
        return true;
    }
    if (s->blen + n > s->bcap && !sink_flush(s)) return false;
    if (n >= s->bcap) return write_all(s->fd, p, n, &s->err);
    memcpy(s->buf + s->blen, p, n);
    s->blen += n;
    return true;
}

/* Writes one tensor's elements little-endian, in chunks. */
static bool emit_tensor(sink *s, const fp4rl_st_write_entry *e, uint64_t nbytes)
{
    uint8_t chunk[8192];
    const uint8_t *src = e->data;
    size_t esize = entry_esize(e), n = (size_t)(nbytes / esize), per = sizeof chunk / 4;
    for (size_t i = 0; i < n; i += per) {
        size_t m = n - i < per ? n - i : per, o = 0;
        for (size_t j = i; j < i + m; j++) {
            if (e->dtype == FP4RL_DTYPE_BF16) {
                uint16_t v;
                memcpy(&v, src + 2 * j, 2);
                chunk[o++] = (uint8_t)v, chunk[o++] = (uint8_t)(v >> 8);
            } else {
                uint32_t v;
                memcpy(&v, src + 4 * j, 4);
                if (e->store_bf16) {
                    uint16_t h = fp4rl_f32_to_bf16(fp4rl_bits_f32(v));
                    chunk[o++] = (uint8_t)h, chunk[o++] = (uint8_t)(h >> 8);
                } else {
                    for (int b = 0; b < 4; b++) chunk[o++] = (uint8_t)(v >> (8 * b));
                }
            }
        }
        if (!sink_put(s, chunk, o)) return false;
    }
    return true;
}

static bool emit_all(sink *s, const plan *p)
{
    if (!sink_put(s, p->prefix, p->prefix_len)) return false;
    for (size_t i = 0; i < p->n; i++)
        if (!emit_tensor(s, p->by_data[i], p->nbytes[p->by_data[i] - p->base])) return false;
    return sink_flush(s);
}

fp4rl_status fp4rl_st_write_mem(void **out, size_t *out_len, const fp4rl_st_write_entry *entries, size_t n_entries,
                                const fp4rl_st_kv *meta, size_t n_meta)
{
    const char *fn = "fp4rl_st_write_mem";
    if (!out || !out_len) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out or out_len is NULL", fn);
    plan p = {0};
    fp4rl_status st = check_entries(&p, entries, n_entries, meta, n_meta, fn);
    if (!st) st = build_header(&p, fn);
    if (st) {
        plan_free(&p);
        return st;
    }
    size_t total = p.prefix_len + (size_t)p.data_bytes;
    sink s = {.mem = malloc(total ? total : 1)};
    if (!s.mem) {
        plan_free(&p);
        return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory (%zu bytes)", fn, total);
    }
    emit_all(&s, &p);
    plan_free(&p);
    if (s.pos != total) {
        free(s.mem);
        return fp4rl_fail(FP4RL_ERR_INTERNAL, "%s: wrote %zu bytes, planned %zu", fn, s.pos, total);
    }
    *out = s.mem;
    *out_len = total;
    return FP4RL_OK;
}

/* The directory part of path ("." when it has none). */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, path, n);
        d[n] = 0;
    }
    return d;
}

static _Thread_local unsigned tmp_serial;

fp4rl_status fp4rl_st_write_path(const char *path, const fp4rl_st_write_entry *entries, size_t n_entries,
                                 const fp4rl_st_kv *meta, size_t n_meta)
{
    const char *fn = "fp4rl_st_write_path";
    char eb[128];
    if (!path || !*path) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: path is NULL or empty", fn);
    if (path[strlen(path) - 1] == '/') return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: '%.300s' names a directory", fn, path);
    plan p = {0};
    fp4rl_status st = check_entries(&p, entries, n_entries, meta, n_meta, fn);
    if (!st) st = build_header(&p, fn);
    char *dir = st ? NULL : dir_of(path), *tmp = NULL;
    sink s = {.fd = -1};
    if (!st && dir) {
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        size_t tn = strlen(dir) + strlen(base) + 64;
        tmp = malloc(tn);
        s.bcap = (size_t)1 << 20;
        s.buf = malloc(s.bcap);
        for (int tries = 0; tmp && s.buf && tries < 1000; tries++) {
            /* Hidden, in the target's directory (so rename is atomic), unique per process and call. */
            snprintf(tmp, tn, "%s/.%.80s.%ld.%u.tmp", dir, base, (long)getpid(), tmp_serial++);
            s.fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
            if (s.fd >= 0 || errno != EEXIST) break;
        }
    }
    if (!st && (!dir || !tmp || !s.buf)) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (st) goto done;
    if (s.fd < 0) {
        st = fp4rl_fail(FP4RL_ERR_IO, "%s: cannot create a temporary file in '%.300s': %s", fn, dir, errtext(errno, eb, sizeof eb));
        goto done;
    }
    bool ok = emit_all(&s, &p);
    if (!ok) st = fp4rl_fail(FP4RL_ERR_IO, "%s: writing '%.300s' failed: %s", fn, tmp, errtext(s.err, eb, sizeof eb));
    if (!st && fsync(s.fd) != 0) st = fp4rl_fail(FP4RL_ERR_IO, "%s: fsync of '%.300s' failed: %s", fn, tmp, errtext(errno, eb, sizeof eb));
    int cr = close(s.fd);
    if (!st && cr != 0) st = fp4rl_fail(FP4RL_ERR_IO, "%s: closing '%.300s' failed: %s", fn, tmp, errtext(errno, eb, sizeof eb));
    if (!st && rename(tmp, path) != 0)
        st = fp4rl_fail(FP4RL_ERR_IO, "%s: cannot rename the temporary file to '%.300s': %s", fn, path, errtext(errno, eb, sizeof eb));
    if (st) {
        unlink(tmp);
        goto done;
    }
    /* Make the rename itself durable. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL))
        st = fp4rl_fail(FP4RL_ERR_IO, "%s: '%.300s' was written, but syncing its directory failed: %s", fn, path,
                        errtext(errno, eb, sizeof eb));
    if (dfd >= 0) close(dfd);
done:
    free(s.buf);
    free(tmp);
    free(dir);
    plan_free(&p);
    return st;
}

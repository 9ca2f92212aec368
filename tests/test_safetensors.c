/*
 * test_safetensors.c - the safetensors reader and writer (core/io/safetensors.h).
 *
 * Round trips (F32, BF16, I32, F32 stored as BF16, scalars and empty tensors, metadata) through
 * memory and through files; a file made byte by byte here; a hostile-input battery (every prefix of
 * a valid file, bad header lengths, malformed JSON, wrong types, bad numbers, overflowing shapes,
 * overlaps, gaps, duplicates, unknown dtypes, bad names) where each case must be FP4RL_ERR_CORRUPT
 * with a message naming what is wrong; thousands of random byte flips of a valid file (seeded, so
 * the run is the same every time) that must never crash or read out of bounds (run it under ASan);
 * and the atomic writer's failures, which must leave an existing file as it was.
 */
#define _POSIX_C_SOURCE 200809L
#include "check_run.h"
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"

#define EXPECT FP4RL_EXPECT /* check_run.h */
#define HAS(substr) ck_assert_msg(strstr(fp4rl_last_error(), (substr)), "message '%s' lacks '%s'", fp4rl_last_error(), (substr))

static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* xorshift64*: the byte-flip run is the same every time. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

/* A scratch directory per test (check forks each test). */
static char tmpdir[64];
static void mk_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fp4rl_st_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}
static void rm_tmpdir(void)
{
    DIR *d = opendir(tmpdir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
        if (rmdir(p) != 0) unlink(p);
    }
    closedir(d);
    rmdir(tmpdir);
}
/* Entries of tmpdir (besides . and ..). */
static int dir_entries(void)
{
    DIR *d = opendir(tmpdir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    ck_assert_uint_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}
static void spit(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* A file of the given header length field, header text and data_len data bytes (0, 1, 2, ...),
 * in a buffer of exactly that size (so ASan sees any read past it). */
static uint8_t *mkfile_n(uint64_t hlen, const char *json, size_t data_len, size_t *len)
{
    size_t jl = strlen(json);
    *len = 8 + jl + data_len;
    uint8_t *b = malloc(*len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(b + 8, json, jl);
    for (size_t i = 0; i < data_len; i++) b[8 + jl + i] = (uint8_t)i;
    return b;
}
static uint8_t *mkfile(const char *json, size_t data_len, size_t *len) { return mkfile_n(strlen(json), json, data_len, len); }

/* Opens json + data_len bytes from memory and expects `want`, with `substr` in the message. */
static void expect_open(const char *json, size_t data_len, fp4rl_status want, const char *substr)
{
    size_t len;
    uint8_t *b = mkfile(json, data_len, &len);
    fp4rl_st *f = (fp4rl_st *)0x1;
    fp4rl_status st = fp4rl_st_open_mem(&f, b, len);
    ck_assert_msg(st == want, "%s: got %s, want %s (%s)", json, fp4rl_status_name(st), fp4rl_status_name(want), fp4rl_last_error());
    if (st == FP4RL_OK) {
        fp4rl_st_close(f);
    } else {
        ck_assert_msg(f == (fp4rl_st *)0x1, "%s: out written on error", json);
        ck_assert_msg(strstr(fp4rl_last_error(), substr), "%s: message '%s' lacks '%s'", json, fp4rl_last_error(), substr);
    }
    free(b);
}
#define BAD(json, data_len, substr) expect_open(json, data_len, FP4RL_ERR_CORRUPT, substr)
#define GOOD(json, data_len) expect_open(json, data_len, FP4RL_OK, "")

/* ---- a valid set of tensors -------------------------------------------------------------- */

static float w_f32[15];
static uint16_t b_bf16[5];
static float c_f32[4];
static int32_t step_i32 = -123456789;
static const int64_t w_shape[2] = {3, 5}, b_shape[1] = {5}, c_shape[2] = {2, 2}, e_shape[2] = {0, 4};

static void fill_values(void)
{
    for (int i = 0; i < 15; i++) w_f32[i] = (float)i * 0.37f - 2.0f;
    w_f32[0] = -0.0f;
    w_f32[1] = bits_f(0x00000001u); /* smallest subnormal */
    w_f32[2] = INFINITY;
    w_f32[3] = bits_f(0x7fc01234u); /* a NaN with a payload */
    uint16_t bv[5] = {0x3f80, 0xc000, 0x0001, 0x7f80, 0x8000};
    memcpy(b_bf16, bv, sizeof bv);
    /* rounded to BF16 to nearest even: 1+2^-8 -> 1, 1+3*2^-8 -> 1+2^-6, 3 -> 3, -1.5 -> -1.5 */
    c_f32[0] = 1.00390625f, c_f32[1] = 1.01171875f, c_f32[2] = 3.0f, c_f32[3] = -1.5f;
}

static size_t sample_entries(fp4rl_st_write_entry *e)
{
    fill_values();
    e[0] = (fp4rl_st_write_entry){"model.w", FP4RL_DTYPE_F32, 2, w_shape, w_f32, 0};
    e[1] = (fp4rl_st_write_entry){"model.b", FP4RL_DTYPE_BF16, 1, b_shape, b_bf16, 0};
    e[2] = (fp4rl_st_write_entry){"c.rounded", FP4RL_DTYPE_F32, 2, c_shape, c_f32, 1};
    e[3] = (fp4rl_st_write_entry){"step", FP4RL_DTYPE_I32, 0, NULL, &step_i32, 0};
    e[4] = (fp4rl_st_write_entry){"empty", FP4RL_DTYPE_F32, 2, e_shape, NULL, 0};
    return 5;
}
static const fp4rl_st_kv sample_meta[] = {{"format", "pt"}, {"note", "gr\xc3\xbc\xc3\x9f \"quoted\" \\ \n"}, {"", "empty key"}};

static void check_sample(const fp4rl_st *f)
{
    ck_assert_uint_eq(fp4rl_st_count(f), 5);
    const char *sorted[] = {"c.rounded", "empty", "model.b", "model.w", "step"};
    for (size_t i = 0; i < 5; i++) ck_assert_str_eq(fp4rl_st_at(f, i)->name, sorted[i]);
    ck_assert_ptr_null(fp4rl_st_at(f, 5));

    const fp4rl_st_tensor *t = fp4rl_st_find(f, "model.w");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->dtype, FP4RL_ST_F32);
    ck_assert_int_eq(t->ndim, 2);
    ck_assert_int_eq(t->shape[0], 3);
    ck_assert_int_eq(t->shape[1], 5);
    ck_assert_int_eq(t->numel, 15);
    ck_assert_uint_eq(t->nbytes, 60);
    float w[15];
    EXPECT(fp4rl_st_read_f32(f, "model.w", 2, w_shape, w), FP4RL_OK);
    for (int i = 0; i < 15; i++) ck_assert_uint_eq(f_bits(w[i]), f_bits(w_f32[i])); /* bit exact, NaN payload too */

    float b[5];
    EXPECT(fp4rl_st_read_f32(f, "model.b", 1, b_shape, b), FP4RL_OK);
    ck_assert_int_eq(fp4rl_st_find(f, "model.b")->dtype, FP4RL_ST_BF16);
    for (int i = 0; i < 5; i++) ck_assert_uint_eq(f_bits(b[i]), (uint32_t)b_bf16[i] << 16);

    float c[4];
    ck_assert_int_eq(fp4rl_st_find(f, "c.rounded")->dtype, FP4RL_ST_BF16);
    EXPECT(fp4rl_st_read_f32(f, "c.rounded", 2, c_shape, c), FP4RL_OK);
    ck_assert(c[0] == 1.0f && c[1] == 1.015625f && c[2] == 3.0f && c[3] == -1.5f);

    t = fp4rl_st_find(f, "step");
    ck_assert_int_eq(t->dtype, FP4RL_ST_I32);
    ck_assert_int_eq(t->ndim, 0);
    ck_assert_int_eq(t->numel, 1);
    int32_t s;
    memcpy(&s, t->data, 4); /* little-endian host assumed by the test */
    ck_assert_int_eq(s, step_i32);

    t = fp4rl_st_find(f, "empty");
    ck_assert_int_eq(t->numel, 0);
    ck_assert_uint_eq(t->nbytes, 0);
    float dummy = 7;
    EXPECT(fp4rl_st_read_f32(f, "empty", 2, e_shape, &dummy), FP4RL_OK);
    ck_assert(dummy == 7);

    ck_assert_uint_eq(fp4rl_st_metadata_count(f), 3);
    ck_assert_str_eq(fp4rl_st_metadata(f, "format"), "pt");
    ck_assert_str_eq(fp4rl_st_metadata(f, "note"), sample_meta[1].value);
    ck_assert_str_eq(fp4rl_st_metadata(f, ""), "empty key");
    ck_assert_ptr_null(fp4rl_st_metadata(f, "missing"));
    const char *k, *v;
    ck_assert_int_eq(fp4rl_st_metadata_at(f, 0, &k, &v), 1);
    ck_assert_str_eq(k, ""); /* sorted by key */
    ck_assert_int_eq(fp4rl_st_metadata_at(f, 3, &k, &v), 0);
}

/* The writer's layout: header length a multiple of 8, keys sorted, padding spaces, each tensor
 * aligned to its element size from the start of the file. */
static void check_layout(const uint8_t *buf, size_t len)
{
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | buf[i];
    ck_assert_uint_eq(n % 8, 0);
    ck_assert_uint_le(8 + n, len);
    char *h = malloc((size_t)n + 1); /* the header as a C string */
    memcpy(h, buf + 8, (size_t)n);
    h[n] = 0;
    ck_assert_int_eq(h[0], '{');
    size_t end = (size_t)n;
    while (end > 0 && h[end - 1] == ' ') end--;
    ck_assert_int_eq(h[end - 1], '}');
    ck_assert_uint_lt(n - end, 8);
    const char *keys[] = {"\"__metadata__\"", "\"c.rounded\"", "\"empty\"", "\"model.b\"", "\"model.w\"", "\"step\""};
    const char *prev = h;
    for (size_t i = 0; i < 6; i++) {
        const char *p = strstr(h, keys[i]);
        ck_assert_msg(p && p > prev && p < h + n, "key %s out of order", keys[i]);
        prev = p;
    }
    free(h);
    fp4rl_st *f;
    EXPECT(fp4rl_st_open_mem(&f, buf, len), FP4RL_OK);
    for (size_t i = 0; i < fp4rl_st_count(f); i++) {
        const fp4rl_st_tensor *t = fp4rl_st_at(f, i);
        ck_assert_uint_eq((size_t)(t->data - buf) % fp4rl_st_dtype_size(t->dtype), 0);
    }
    fp4rl_st_close(f);
}

START_TEST(test_roundtrip_mem_and_path)
{
    fp4rl_st_write_entry e[8];
    size_t n = sample_entries(e);
    void *mem = NULL;
    size_t mlen = 0;
    EXPECT(fp4rl_st_write_mem(&mem, &mlen, e, n, sample_meta, 3), FP4RL_OK);
    check_layout(mem, mlen);
    fp4rl_st *f;
    EXPECT(fp4rl_st_open_mem(&f, mem, mlen), FP4RL_OK);
    check_sample(f);
    fp4rl_st_close(f);

    mk_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
    EXPECT(fp4rl_st_write_path(path, e, n, sample_meta, 3), FP4RL_OK);
    size_t flen;
    uint8_t *fb = slurp(path, &flen);
    ck_assert_uint_eq(flen, mlen);
    ck_assert(memcmp(fb, mem, mlen) == 0); /* the same bytes, deterministically */
    free(fb);
    EXPECT(fp4rl_st_open_path(&f, path), FP4RL_OK);
    check_sample(f);
    fp4rl_st_close(f);
    ck_assert_int_eq(dir_entries(), 1); /* no temporary file left behind */

    /* overwrite with a different file: replaced whole */
    EXPECT(fp4rl_st_write_path(path, e, 1, NULL, 0), FP4RL_OK);
    EXPECT(fp4rl_st_open_path(&f, path), FP4RL_OK);
    ck_assert_uint_eq(fp4rl_st_count(f), 1);
    ck_assert_uint_eq(fp4rl_st_metadata_count(f), 0);
    fp4rl_st_close(f);

    /* no tensors at all: "{}" padded, and it reads back */
    EXPECT(fp4rl_st_write_path(path, NULL, 0, NULL, 0), FP4RL_OK);
    EXPECT(fp4rl_st_open_path(&f, path), FP4RL_OK);
    ck_assert_uint_eq(fp4rl_st_count(f), 0);
    fp4rl_st_close(f);
    /* a relative path (no directory part) works too */
    char cwd[512];
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    ck_assert_int_eq(chdir(tmpdir), 0);
    EXPECT(fp4rl_st_write_path("rel.safetensors", e, n, NULL, 0), FP4RL_OK);
    EXPECT(fp4rl_st_open_path(&f, "rel.safetensors"), FP4RL_OK);
    fp4rl_st_close(f);
    ck_assert_int_eq(chdir(cwd), 0);
    free(mem);
    rm_tmpdir();
}
END_TEST

/* A file written out byte by byte here, not by the writer. */
START_TEST(test_handmade_file)
{
    static const char json[] =
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        " \"h\" : {\"shape\":[3],\"dtype\":\"F16\",\"data_offsets\":[8,14], \"extra\": \"ignored\"},\n"
        "\"__metadata__\":{\"k\":\"v\"},"
        "\"bf\":{\"dtype\":\"BF16\",\"shape\":[1,1],\"data_offsets\":[14,16]},"
        "\"ids\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[16,24]},"
        "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[24,24]}}   ";
    static const uint8_t data[24] = {
        0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x00, 0xc0, /* F32 1.5, -2 */
        0x00, 0x3c, 0x01, 0x00, 0x00, 0xfc,             /* F16 1, 2^-24, -inf */
        0x49, 0x40,                                     /* BF16 0x4049 = 3.140625 */
        0x05, 0, 0, 0, 0, 0, 0, 0,                      /* I64 5 */
    };
    size_t jl = strlen(json), len = 8 + jl + sizeof data;
    uint8_t *b = malloc(len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)jl >> (8 * i));
    memcpy(b + 8, json, jl);
    memcpy(b + 8 + jl, data, sizeof data);
    fp4rl_st *f;
    EXPECT(fp4rl_st_open_mem(&f, b, len), FP4RL_OK);
    ck_assert_uint_eq(fp4rl_st_count(f), 5);
    ck_assert_str_eq(fp4rl_st_metadata(f, "k"), "v");
    const fp4rl_st_tensor *t = fp4rl_st_find(f, "h");
    ck_assert_ptr_eq(t->data, b + 8 + jl + 8); /* points into the buffer, unaligned */
    ck_assert_uint_eq(t->offset, 8);
    float w[2], h[3], bf;
    int64_t two = 2, three = 3, one1[2] = {1, 1};
    EXPECT(fp4rl_st_read_f32(f, "w", 1, &two, w), FP4RL_OK);
    ck_assert(w[0] == 1.5f && w[1] == -2.0f);
    EXPECT(fp4rl_st_read_f32(f, "h", 1, &three, h), FP4RL_OK);
    ck_assert(h[0] == 1.0f && h[1] == 0x1p-24f && isinf(h[2]) && h[2] < 0);
    EXPECT(fp4rl_st_read_f32(f, "bf", 2, one1, &bf), FP4RL_OK);
    ck_assert(bf == 3.140625f);
    ck_assert_int_eq(fp4rl_st_find(f, "ids")->data[0], 5);

    /* what read_f32 says about a missing tensor, another shape, another dtype */
    float dst[64] = {0};
    int64_t want[2] = {64, 64};
    EXPECT(fp4rl_st_read_f32(f, "model.layers.0.self_attn.q_proj.weight", 2, want, dst), FP4RL_ERR_CORRUPT);
    HAS("model.layers.0.self_attn.q_proj.weight");
    HAS("no such tensor");
    int64_t two_one[2] = {2, 1};
    EXPECT(fp4rl_st_read_f32(f, "w", 2, two_one, dst), FP4RL_ERR_CORRUPT);
    HAS("w: expected [2, 1], file has [2]");
    ck_assert(dst[0] == 0); /* untouched */
    EXPECT(fp4rl_st_read_f32(f, "w", 1, &three, dst), FP4RL_ERR_CORRUPT);
    HAS("expected [3], file has [2]");
    int64_t one = 1;
    EXPECT(fp4rl_st_read_f32(f, "ids", 1, &one, dst), FP4RL_ERR_DTYPE);
    HAS("I64");
    EXPECT(fp4rl_st_read_f32(f, "w", 1, &two, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_st_read_f32(f, NULL, 1, &two, dst), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_st_read_f32(NULL, "w", 1, &two, dst), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_st_read_f32(f, "w", 9, want, dst), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_st_read_f32(f, "w", 1, NULL, dst), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(fp4rl_st_find(f, "nope"));
    ck_assert_ptr_null(fp4rl_st_find(f, NULL));
    fp4rl_st_close(f);
    fp4rl_st_close(NULL);
    ck_assert_uint_eq(fp4rl_st_count(NULL), 0);
    free(b);
}
END_TEST

/* Every proper prefix of a valid file is corrupt; none is read past its end. */
START_TEST(test_every_prefix)
{
    fp4rl_st_write_entry e[8];
    size_t n = sample_entries(e);
    void *mem;
    size_t mlen;
    EXPECT(fp4rl_st_write_mem(&mem, &mlen, e, n, sample_meta, 3), FP4RL_OK);
    for (size_t cut = 0; cut < mlen; cut++) {
        uint8_t *p = malloc(cut ? cut : 1);
        memcpy(p, mem, cut);
        fp4rl_st *f = NULL;
        fp4rl_status st = fp4rl_st_open_mem(&f, p, cut);
        ck_assert_msg(st == FP4RL_ERR_CORRUPT, "prefix %zu of %zu: %s (%s)", cut, mlen, fp4rl_status_name(st), fp4rl_last_error());
        ck_assert_ptr_null(f);
        free(p);
    }
    /* and through files, for a few lengths */
    mk_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/cut.safetensors", tmpdir);
    size_t cuts[] = {0, 1, 7, 8, 9, mlen / 2, mlen - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        spit(path, mem, cuts[i]);
        fp4rl_st *f = NULL;
        EXPECT(fp4rl_st_open_path(&f, path), FP4RL_ERR_CORRUPT);
        HAS("cut.safetensors");
    }
    free(mem);
    rm_tmpdir();
}
END_TEST

START_TEST(test_header_length)
{
    const char *ok = "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}";
    size_t jl = strlen(ok), len;
    uint64_t bad[] = {0, 1, UINT64_MAX, (uint64_t)1 << 63, FP4RL_ST_MAX_HEADER + 1ull, jl + 3, jl - 1};
    const char *why[] = {"smallest", "smallest", "limit", "limit", "limit", "past the end", "JSON"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t *b = mkfile_n(bad[i], ok, 2, &len);
        fp4rl_st *f;
        EXPECT(fp4rl_st_open_mem(&f, b, len), FP4RL_ERR_CORRUPT);
        HAS(why[i]);
        free(b);
    }
    /* the header length is right but the data is one byte short / long */
    uint8_t *b = mkfile(ok, 2, &len);
    fp4rl_st *f;
    EXPECT(fp4rl_st_open_mem(&f, b, len), FP4RL_OK);
    fp4rl_st_close(f);
    EXPECT(fp4rl_st_open_mem(&f, b, len - 1), FP4RL_ERR_CORRUPT);
    HAS("'a'");
    free(b);
    BAD(ok, 3, "belong to no tensor");
    /* a header padded with NUL bytes instead of spaces */
    uint8_t nulpad[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, 0, 0, 0, 0, 0};
    EXPECT(fp4rl_st_open_mem(&f, nulpad, sizeof nulpad), FP4RL_ERR_CORRUPT);
    HAS("control byte 0x00");
    /* a length of 8 bytes and nothing else */
    uint8_t eight[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    EXPECT(fp4rl_st_open_mem(&f, eight, 8), FP4RL_ERR_CORRUPT);
    EXPECT(fp4rl_st_open_mem(&f, eight, 0), FP4RL_ERR_CORRUPT);
    EXPECT(fp4rl_st_open_mem(&f, NULL, 0), FP4RL_ERR_CORRUPT);
    EXPECT(fp4rl_st_open_mem(&f, NULL, 5), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_st_open_mem(NULL, eight, 8), FP4RL_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_malformed_headers)
{
    GOOD("{}", 0);
    GOOD("{}      ", 0);
    GOOD("{ \"__metadata__\" : {} }\n\t\r ", 0);
    GOOD("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4); /* a scalar */
    BAD("{}", 1, "belong to no tensor");
    BAD(" {}", 0, "begin with '{'");
    BAD("[]", 0, "begin with '{'");
    BAD("{\"a\":", 0, "not valid JSON");
    BAD("{\"a\" 1}", 0, "not valid JSON");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],}}", 4, "not valid JSON");
    BAD("{'a':1}", 0, "not valid JSON");
    BAD("{} {}", 0, "after its JSON object");
    BAD("{}x", 0, "after its JSON object");
    BAD("{\"a\":1}", 0, "tensor 'a': the entry is a JSON number");
    BAD("{\"a\":[1,2]}", 0, "tensor 'a': the entry is a JSON array");
    BAD("{\"a\":null}", 0, "tensor 'a'");
    /* missing and duplicated fields */
    BAD("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a': the entry has no \"dtype\"");
    BAD("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "no \"shape\"");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "no \"data_offsets\"");
    BAD("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"dtype\" appears twice");
    /* wrong JSON types */
    BAD("{\"a\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a': dtype is a JSON number");
    BAD("{\"a\":{\"dtype\":[\"F32\"],\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype is a JSON array");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4, "tensor 'a': shape is a JSON number");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,4]}}", 4, "shape is a JSON object");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, "shape[0] is not a number");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[true],\"data_offsets\":[0,4]}}", 4, "shape[0] is not a number");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[null],\"data_offsets\":[0,4]}}", 4, "shape[0] is not a number");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[[1]],\"data_offsets\":[0,4]}}", 4, "shape[0] is not a number");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0,4\"}}", 4, "data_offsets is a JSON string");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "exactly 2");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[]}}", 4, "exactly 2");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,4]}}", 4, "exactly 2");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",4]}}", 4, "data_offsets[0] is not a number");
    /* unknown dtypes (names are case-sensitive) */
    BAD("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a': unknown dtype \"F33\"");
    BAD("{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype");
    BAD("{\"a\":{\"dtype\":\"\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype");
    BAD("{\"a\":{\"dtype\":\"F32 \",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype");
    /* bad numbers */
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape[0] is negative");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "shape[0] is not an integer");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]}}", 4, "shape[0] is 2^53 or more");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1e999],\"data_offsets\":[0,4]}}", 4, "shape[0] is out of range");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[9007199254740993],\"data_offsets\":[0,4]}}", 4, "2^53");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, "data_offsets[0] is negative");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.5]}}", 4, "data_offsets[1] is not an integer");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18446744073709551620]}}", 4, "data_offsets[1] is 2^53");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[18446744073709551612,18446744073709551616]}}", 4, "2^53");
    /* exact integers spelled otherwise, which a double cannot tell from the integer */
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "tensor 'a': the number '1.0'");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4e0]}}", 4, "'4e0'");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-0,4]}}", 4, "'-0'");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, "'01'");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[4,5.]}}", 5,
        "tensor 'b': the number '5.'");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":0.5}}", 4, "'0.5'"); /* even in an ignored field */
    /* sizes that do not add up */
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "tensor 'a': shape [2] of F32 is 8 bytes, but data_offsets [0, 4] hold 4");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "run backwards");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 4, "run past the data section");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "gap before 'a'");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 4, "tensor 'a': the element count of its shape overflows");
    BAD("{\"a\":{\"dtype\":\"U64\",\"shape\":[4503599627370495,4503599627370495,4503599627370495],\"data_offsets\":[0,8]}}", 8, "overflows");
    BAD("{\"a\":{\"dtype\":\"U64\",\"shape\":[1152921504606846976],\"data_offsets\":[0,8]}}", 8, "2^53");
    BAD("{\"a\":{\"dtype\":\"U64\",\"shape\":[1099511627776,2048],\"data_offsets\":[0,8]}}", 8,
        "is 18014398509481984 bytes, but data_offsets [0, 8] hold 8"); /* 2^51 elements of 8 bytes */
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "more than 8 dims");
    GOOD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4);
    GOOD("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]}}", 0); /* a zero dim: no overflow */
    /* overlaps, gaps and the end of the data section */
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
        "tensors 'a' and 'b' overlap");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
        "overlap");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8,
        "overlap"); /* an empty tensor inside another */
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12,
        "bytes [4, 8) of the data section belong to no tensor (a gap before 'b')");
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 5, "bytes [4, 5) at the end");
    GOOD("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
    /* names */
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2,
        "tensor name 'a' appears twice");
    BAD("{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "empty");
    BAD("{\"a\\u0001b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "control character 0x01");
    BAD("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"a\\u0000c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
        2, "\\u0000");
    BAD("{\"a\tb\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "control character 0x09");
    BAD("{\"a\x01\":{}}", 0, "control byte 0x01");
    BAD("{\"\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "not valid UTF-8");
    BAD("{\"\xc0\xaf\":{}}", 0, "not valid UTF-8");         /* overlong '/' */
    BAD("{\"\xed\xa0\x80\":{}}", 0, "not valid UTF-8");     /* a surrogate */
    BAD("{\"\xf4\x90\x80\x80\":{}}", 0, "not valid UTF-8"); /* above U+10FFFF */
    BAD("{\"\xe2\x82\":{}}", 0, "not valid UTF-8");         /* cut short */
    GOOD("{\"gr\xc3\xbc\xc3\x9f.\xf0\x9f\x98\x80\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    GOOD("{\"a\\\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1); /* an escaped backslash, then text */
    {
        char big[4200];
        int o = sprintf(big, "{\"");
        for (int i = 0; i < FP4RL_ST_MAX_NAME + 1; i++) big[o++] = 'n';
        sprintf(big + o, "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}");
        BAD(big, 1, "at most 1024");
        memmove(big + 3, big + 4, strlen(big + 4) + 1); /* exactly the limit */
        GOOD(big, 1);
    }
    /* metadata */
    BAD("{\"__metadata__\":[]}", 0, "\"__metadata__\" is a JSON array");
    BAD("{\"__metadata__\":\"x\"}", 0, "\"__metadata__\" is a JSON string");
    BAD("{\"__metadata__\":{\"k\":1}}", 0, "\"__metadata__\" key 'k': the value is a JSON number");
    BAD("{\"__metadata__\":{\"k\":null}}", 0, "key 'k'");
    BAD("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "key 'k' appears twice");
    BAD("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "\"__metadata__\" appears twice");
    BAD("{\"__metadata__\":{\"k\":\"a\\u0000b\"}}", 0, "\\u0000");
    /* nesting deep enough to exhaust a recursive parser's stack is refused cleanly */
    {
        size_t depth = 200000;
        char *deep = malloc(2 * depth + 64);
        size_t o = (size_t)sprintf(deep, "{\"a\":");
        for (size_t i = 0; i < depth; i++) deep[o++] = '[';
        for (size_t i = 0; i < depth; i++) deep[o++] = ']';
        strcpy(deep + o, "}");
        BAD(deep, 0, "not valid JSON");
        free(deep);
    }
}
END_TEST

/* Random byte flips of a valid file: whatever comes out, nothing crashes or reads out of bounds,
 * and a file that is accepted is self-consistent. */
START_TEST(test_random_flips)
{
    fp4rl_st_write_entry e[8];
    size_t n = sample_entries(e);
    void *mem;
    size_t mlen;
    EXPECT(fp4rl_st_write_mem(&mem, &mlen, e, n, sample_meta, 3), FP4RL_OK);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = hn << 8 | ((uint8_t *)mem)[i];
    static const char interesting[] = "{}[]\",:0123456789-.eE \\u";
    int accepted = 0;
    rng_state = 0x5eed5eed5eed5eedull;
    for (int it = 0; it < 6000; it++) {
        size_t len = mlen;
        if (it % 10 == 9) len = (size_t)(rnd() % (mlen + 1)); /* sometimes cut short as well */
        uint8_t *b = malloc(len ? len : 1);
        memcpy(b, mem, len);
        int flips = 1 + (int)(rnd() % 4);
        for (int k = 0; k < flips && len; k++) {
            /* mostly in the header, where the structure is */
            size_t pos = rnd() % 4 ? 8 + (size_t)(rnd() % hn) : (size_t)(rnd() % len);
            if (pos >= len) continue;
            uint64_t r = rnd();
            if (r % 3 == 0) b[pos] = (uint8_t)interesting[(r >> 8) % (sizeof interesting - 1)];
            else if (r % 3 == 1) b[pos] ^= (uint8_t)(1u << ((r >> 8) % 8));
            else b[pos] = (uint8_t)(r >> 8);
        }
        fp4rl_st *f = NULL;
        fp4rl_status st = fp4rl_st_open_mem(&f, b, len);
        ck_assert_msg(st == FP4RL_OK || st == FP4RL_ERR_CORRUPT, "iteration %d: %s (%s)", it, fp4rl_status_name(st), fp4rl_last_error());
        if (st == FP4RL_OK) {
            accepted++;
            uint64_t total = 0;
            for (size_t i = 0; i < fp4rl_st_count(f); i++) {
                const fp4rl_st_tensor *t = fp4rl_st_at(f, i);
                ck_assert(t->data >= b && t->data + t->nbytes <= b + len);
                ck_assert_uint_eq(t->nbytes, (size_t)t->numel * fp4rl_st_dtype_size(t->dtype));
                ck_assert_ptr_eq(fp4rl_st_find(f, t->name), t);
                total += t->nbytes;
                if (t->dtype == FP4RL_ST_F32 || t->dtype == FP4RL_ST_BF16 || t->dtype == FP4RL_ST_F16) {
                    float *dst = malloc((size_t)t->numel * sizeof(float) + 1);
                    EXPECT(fp4rl_st_read_f32(f, t->name, t->ndim, t->shape, dst), FP4RL_OK);
                    free(dst);
                }
            }
            ck_assert_uint_le(total, len);
            for (size_t i = 0; i < fp4rl_st_metadata_count(f); i++) {
                const char *k, *v;
                ck_assert(fp4rl_st_metadata_at(f, i, &k, &v));
                ck_assert_ptr_nonnull(k);
                ck_assert_ptr_nonnull(v);
            }
            fp4rl_st_close(f);
        } else {
            ck_assert_ptr_null(f);
        }
        free(b);
    }
    /* flips in the data section and harmless header flips (a metadata value) keep the file valid */
    ck_assert_int_gt(accepted, 100);
    free(mem);
}
END_TEST

START_TEST(test_open_path_errors)
{
    mk_tmpdir();
    char path[256];
    fp4rl_st *f = NULL;
    snprintf(path, sizeof path, "%s/missing.safetensors", tmpdir);
    EXPECT(fp4rl_st_open_path(&f, path), FP4RL_ERR_IO);
    HAS("missing.safetensors");
    HAS("No such file");
    EXPECT(fp4rl_st_open_path(&f, tmpdir), FP4RL_ERR_IO); /* a directory */
    HAS("not a regular file");
    spit(path, "", 0);
    EXPECT(fp4rl_st_open_path(&f, path), FP4RL_ERR_CORRUPT);
    EXPECT(fp4rl_st_open_path(&f, "/dev/null"), FP4RL_ERR_IO);
    EXPECT(fp4rl_st_open_path(&f, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_st_open_path(NULL, path), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(f);
    rm_tmpdir();
}
END_TEST

START_TEST(test_writer_rejects_bad_entries)
{
    mk_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/x.safetensors", tmpdir);
    float v[4] = {1, 2, 3, 4};
    int64_t s4 = 4, neg = -1, huge[2] = {INT64_MAX / 4, 16};
    fp4rl_st_write_entry ok = {"a", FP4RL_DTYPE_F32, 1, &s4, v, 0};
    fp4rl_st_write_entry e[2];
#define REJECT(mod, substr)                                                                  \
    do {                                                                                     \
        e[0] = ok;                                                                           \
        e[1] = ok;                                                                           \
        e[1].name = "b";                                                                     \
        mod;                                                                                 \
        EXPECT(fp4rl_st_write_path(path, e, 2, NULL, 0), FP4RL_ERR_INVALID_ARGUMENT);        \
        HAS(substr);                                                                         \
        void *m_ = NULL;                                                                     \
        size_t ml_;                                                                          \
        EXPECT(fp4rl_st_write_mem(&m_, &ml_, e, 2, NULL, 0), FP4RL_ERR_INVALID_ARGUMENT);    \
        ck_assert_ptr_null(m_);                                                              \
    } while (0)
    REJECT(e[1].name = NULL, "NULL name");
    REJECT(e[1].name = "", "empty");
    REJECT(e[1].name = "a", "'a' appears twice");
    REJECT(e[1].name = "__metadata__", "__metadata__");
    REJECT(e[1].name = "bad\nname", "control character");
    REJECT(e[1].name = "bad\xff", "UTF-8");
    REJECT(e[1].dtype = FP4RL_DTYPE_MXFP4, "mxfp4");
    REJECT(e[1].dtype = FP4RL_DTYPE_BF16; e[1].store_bf16 = 1, "store_bf16");
    REJECT(e[1].shape = &neg, "dim 0 is -1");
    REJECT(e[1].ndim = 9, "ndim 9");
    REJECT(e[1].ndim = -1, "ndim -1");
    REJECT(e[1].shape = NULL, "NULL shape");
    REJECT(e[1].data = NULL, "data is NULL");
    REJECT(e[1].ndim = 2; e[1].shape = huge, "too large");
    ck_assert_int_eq(dir_entries(), 0); /* nothing touched the disk */
    e[0] = ok;
    fp4rl_st_kv dup[2] = {{"k", "1"}, {"k", "2"}}, nul[1] = {{"k", NULL}}, bad[1] = {{"k", "\xc3"}};
    EXPECT(fp4rl_st_write_path(path, e, 1, dup, 2), FP4RL_ERR_INVALID_ARGUMENT);
    HAS("'k' appears twice");
    EXPECT(fp4rl_st_write_path(path, e, 1, nul, 1), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_st_write_path(path, e, 1, bad, 1), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_st_write_path(path, NULL, 1, NULL, 0), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_st_write_path(path, e, 1, NULL, 1), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_st_write_path(NULL, e, 1, NULL, 0), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_st_write_path("", e, 1, NULL, 0), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_st_write_mem(NULL, NULL, e, 1, NULL, 0), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(dir_entries(), 0);
    rm_tmpdir();
}
END_TEST

/* The old content of `path` is still there, byte for byte, and no temporary file is left. */
static void expect_intact(const char *path, const void *old, size_t old_len, int entries)
{
    size_t n;
    uint8_t *b = slurp(path, &n);
    ck_assert_uint_eq(n, old_len);
    ck_assert(memcmp(b, old, n) == 0);
    free(b);
    ck_assert_int_eq(dir_entries(), entries);
}

START_TEST(test_atomic_write_failures)
{
    mk_tmpdir();
    fp4rl_st_write_entry e[8];
    size_t n = sample_entries(e);
    char path[256], bad[300];
    snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
    EXPECT(fp4rl_st_write_path(path, e, n, sample_meta, 3), FP4RL_OK);
    size_t old_len;
    uint8_t *old = slurp(path, &old_len);

    /* a directory that does not exist */
    snprintf(bad, sizeof bad, "%s/no/such/dir/model.safetensors", tmpdir);
    EXPECT(fp4rl_st_write_path(bad, e, n, NULL, 0), FP4RL_ERR_IO);
    HAS("No such file or directory");
    /* a "directory" that is a file */
    snprintf(bad, sizeof bad, "%s/model.safetensors/x.safetensors", tmpdir);
    EXPECT(fp4rl_st_write_path(bad, e, n, NULL, 0), FP4RL_ERR_IO);
    HAS("Not a directory");
    expect_intact(path, old, old_len, 1);

    /* the target is a directory: the temp file is written, the rename fails, the temp is removed */
    snprintf(bad, sizeof bad, "%s/adir", tmpdir);
    ck_assert_int_eq(mkdir(bad, 0755), 0);
    EXPECT(fp4rl_st_write_path(bad, e, n, NULL, 0), FP4RL_ERR_IO);
    HAS("rename");
    struct stat sb;
    ck_assert_int_eq(stat(bad, &sb), 0);
    ck_assert(S_ISDIR(sb.st_mode));
    expect_intact(path, old, old_len, 2);
    rmdir(bad);
    snprintf(bad, sizeof bad, "%s/", tmpdir);
    EXPECT(fp4rl_st_write_path(bad, e, n, NULL, 0), FP4RL_ERR_INVALID_ARGUMENT);

    /* the disk "fills up" in the middle of the data (a file size limit): the old file survives */
    static float big[64 * 64];
    for (int i = 0; i < 64 * 64; i++) big[i] = (float)i;
    int64_t bs[2] = {64, 64};
    fp4rl_st_write_entry be = {"big", FP4RL_DTYPE_F32, 2, bs, big, 0};
    struct rlimit saved, lim;
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &saved), 0);
    lim = saved;
    lim.rlim_cur = 4096;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    fp4rl_status st = fp4rl_st_write_path(path, &be, 1, NULL, 0);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fp4rl_last_error());
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &saved), 0);
    signal(SIGXFSZ, old_handler);
    ck_assert_msg(st == FP4RL_ERR_IO, "%s (%s)", fp4rl_status_name(st), msg);
    ck_assert_msg(strstr(msg, "File too large"), "%s", msg);
    expect_intact(path, old, old_len, 1);

    /* a read-only directory (root ignores permissions, so only as another user) */
    if (geteuid() != 0) {
        ck_assert_int_eq(chmod(tmpdir, 0555), 0);
        EXPECT(fp4rl_st_write_path(path, &be, 1, NULL, 0), FP4RL_ERR_IO);
        HAS("Permission denied");
        ck_assert_int_eq(chmod(tmpdir, 0755), 0);
        expect_intact(path, old, old_len, 1);
    }

    /* and after all that, a normal write still replaces the file */
    EXPECT(fp4rl_st_write_path(path, &be, 1, NULL, 0), FP4RL_OK);
    fp4rl_st *f;
    EXPECT(fp4rl_st_open_path(&f, path), FP4RL_OK);
    float got[64 * 64];
    EXPECT(fp4rl_st_read_f32(f, "big", 2, bs, got), FP4RL_OK);
    ck_assert(memcmp(got, big, sizeof big) == 0);
    fp4rl_st_close(f);
    ck_assert_int_eq(dir_entries(), 1);
    free(old);
    rm_tmpdir();
}
END_TEST

START_TEST(test_dtype_table)
{
    ck_assert_str_eq(fp4rl_st_dtype_name(FP4RL_ST_BF16), "BF16");
    ck_assert_str_eq(fp4rl_st_dtype_name((fp4rl_st_dtype)99), "?");
    ck_assert_uint_eq(fp4rl_st_dtype_size(FP4RL_ST_F64), 8);
    ck_assert_uint_eq(fp4rl_st_dtype_size((fp4rl_st_dtype)-1), 0);
    /* every dtype of the format is read, with its element size */
    for (int d = 0; d < FP4RL_ST_DTYPE_COUNT; d++) {
        char json[200];
        size_t sz = fp4rl_st_dtype_size((fp4rl_st_dtype)d);
        snprintf(json, sizeof json, "{\"t\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[0,%zu]}}", fp4rl_st_dtype_name((fp4rl_st_dtype)d), 3 * sz);
        GOOD(json, 3 * sz);
        BAD(json, 3 * sz + 1, "belong to no tensor");
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("safetensors");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_roundtrip_mem_and_path);
    tcase_add_test(tc, test_handmade_file);
    tcase_add_test(tc, test_every_prefix);
    tcase_add_test(tc, test_header_length);
    tcase_add_test(tc, test_malformed_headers);
    tcase_add_test(tc, test_random_flips);
    tcase_add_test(tc, test_open_path_errors);
    tcase_add_test(tc, test_writer_rejects_bad_entries);
    tcase_add_test(tc, test_atomic_write_failures);
    tcase_add_test(tc, test_dtype_table);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}

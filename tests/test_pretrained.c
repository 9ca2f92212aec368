/*
 * test_pretrained.c - models as transformers writes them: fp4rl_model_from_pretrained on the
 * committed transformers-5 fixtures (single file and sharded) against HF's logits, eos ids as the
 * sessions' default stop tokens, fp4rl_model_save_pretrained round trips, refusal of corrupt or
 * inconsistent indexes and shards (weights unchanged), of special files, and of targets that are
 * not ours.
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fp4rl/fp4rl.h>

#include "check_run.h"
#include "io/safetensors.h"

#include "fixtures_path.h"

static fp4rl_context *ctx;
static char tmp[256];
static void setup(void)
{
    ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
    snprintf(tmp, sizeof tmp, "/tmp/fp4rl_pretrained_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp));
}
static void rm_rf(const char *path)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    ck_assert_int_eq(system(cmd), 0);
}
static void teardown(void)
{
    rm_rf(tmp);
    fp4rl_context_destroy(ctx);
}

#define OK(call) ck_assert_msg((call) == FP4RL_OK, "%s: %s", #call, fp4rl_last_error())

static void expect(fp4rl_status got, fp4rl_status want, const char *s1, const char *s2)
{
    const char *msg = fp4rl_last_error();
    ck_assert_msg(got == want, "got %s, expected %s (%s)", fp4rl_status_name(got), fp4rl_status_name(want), msg);
    ck_assert_msg(!s1 || strstr(msg, s1), "message lacks \"%s\": %s", s1, msg);
    ck_assert_msg(!s2 || strstr(msg, s2), "message lacks \"%s\": %s", s2, msg);
}

static char *path_in(const char *dir, const char *name)
{
    static char p[8][1024];
    static int k;
    char buf[2100];
    k = (k + 1) % 8;
    ck_assert(strlen(dir) + strlen(name) + 2 <= sizeof p[k]);
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    memcpy(p[k], buf, sizeof p[k]);
    return p[k];
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

static char *read_all(const char *path, size_t *n)
{
    uint8_t *b = NULL;
    OK(fp4rl_read_file(path, (size_t)1 << 30, &b, n, "test"));
    return (char *)b;
}

/* Copies the regular files of the flat directory src into a new directory dst. */
static void copy_dir(const char *src, const char *dst)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/* '%s'/", dst, src, dst);
    ck_assert_int_eq(system(cmd), 0);
}

/* Replaces the first `from` in the file (binary or text) by `to`. */
static void edit_file(const char *path, const char *from, const char *to)
{
    size_t n, k = strlen(from);
    char *s = read_all(path, &n), *at = NULL;
    for (size_t i = 0; !at && i + k <= n; i++)
        if (memcmp(s + i, from, k) == 0) at = s + i;
    ck_assert_msg(at != NULL, "%s lacks %s", path, from);
    FILE *f = fopen(path, "wb");
    fwrite(s, 1, (size_t)(at - s), f);
    fputs(to, f);
    fwrite(at + k, 1, n - (size_t)(at - s) - k, f);
    fclose(f);
    free(s);
}

/* All weights of m, in parameter order (malloc'd; *n floats). */
static float *weights(const fp4rl_model *m, int64_t *n)
{
    int64_t total = 0, nt = 0;
    OK(fp4rl_model_get_info(m, FP4RL_MI_NUM_PARAMETERS, &total));
    OK(fp4rl_model_get_info(m, FP4RL_MI_NUM_TENSORS, &nt));
    float *w = malloc((size_t)total * sizeof *w);
    int64_t o = 0;
    for (int64_t i = 0; i < nt; i++) {
        const char *name = fp4rl_model_param_name(m, (size_t)i);
        int nd;
        int64_t d[2];
        OK(fp4rl_model_param_shape(m, name, &nd, d));
        int64_t k = nd == 2 ? d[0] * d[1] : d[0];
        OK(fp4rl_model_get_param(m, name, w + o, (size_t)k * sizeof *w));
        o += k;
    }
    ck_assert_int_eq(o, total);
    *n = total;
    return w;
}

static void expect_weights(const fp4rl_model *m, const float *want, int64_t n)
{
    int64_t k;
    float *w = weights(m, &k);
    ck_assert_int_eq(k, n);
    ck_assert_msg(memcmp(w, want, (size_t)n * sizeof *w) == 0, "weights changed");
    free(w);
}

/* fp4rl's logits on the fixture's reference.safetensors inputs, against HF's: relative error. */
static double hf_logits_error(fp4rl_model *m, const char *dir)
{
    fp4rl_st *ref;
    OK(fp4rl_st_open_path(&ref, path_in(dir, "reference.safetensors")));
    const fp4rl_st_tensor *ids = fp4rl_st_find(ref, "input_ids"), *lg = fp4rl_st_find(ref, "logits");
    ck_assert(ids && lg && ids->ndim == 2 && lg->ndim == 3);
    const int64_t B = ids->shape[0], T = ids->shape[1], V = lg->shape[2];
    int32_t *tok = malloc((size_t)(B * T) * 4), len[16];
    ck_assert(B <= 16);
    memcpy(tok, ids->data, (size_t)(B * T) * 4);
    memcpy(len, fp4rl_st_find(ref, "lengths")->data, (size_t)B * 4);
    float *got = malloc((size_t)(B * T * V) * 4), *want = malloc((size_t)(B * T * V) * 4);
    OK(fp4rl_st_read_f32(ref, "logits", 3, lg->shape, want));
    OK(fp4rl_model_logits(m, tok, len, B, T, got, (size_t)(B * T * V) * 4));
    for (int64_t b = 0; b < B; b++) /* HF's padded positions are zeroed */
        for (int64_t t = len[b]; t < T; t++) memset(got + (b * T + t) * V, 0, (size_t)V * 4);
    double e = fp4rl_l2rel(got, want, B * T * V);
    free(tok);
    free(got);
    free(want);
    fp4rl_st_close(ref);
    return e;
}

static void stop_tokens(fp4rl_model *m, int32_t *ids, size_t cap, size_t *n)
{
    fp4rl_rl_session *s;
    OK(fp4rl_rl_session_create(&s, ctx, m, NULL));
    OK(fp4rl_rl_session_get_stop_tokens(s, ids, cap, n));
    fp4rl_rl_session_destroy(s);
}

/* One fixture directory against HF's logits; n_eos ids expected as the default stop tokens. */
static void check_fixture(const char *name, const int32_t *eos, size_t n_eos)
{
    char dir[512];
    FP4RL_FIXTURE(dir, "%s", name);
    fp4rl_model *m;
    fp4rl_quant_policy *p;
    OK(fp4rl_quant_policy_create(&p));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_FP32));
    OK(fp4rl_model_from_pretrained(&m, ctx, dir, p));
    fp4rl_quant_policy_destroy(p);
    double e = hf_logits_error(m, dir);
    printf("from_pretrained %s: logits rel. error vs HF %.3g (bound 1e-5)\n", name, e);
    ck_assert_msg(e <= 1e-5, "%s: logits rel. error %.3g > 1e-5", name, e);
    int32_t ids[4] = {-1, -1, -1, -1};
    size_t n = 99;
    stop_tokens(m, NULL, 0, &n);
    ck_assert_uint_eq(n, n_eos);
    stop_tokens(m, ids, 4, &n);
    for (size_t i = 0; i < n_eos; i++) ck_assert_int_eq(ids[i], eos[i]);
    ck_assert_int_eq(ids[n_eos], -1);
    if (n_eos > 1) {
        stop_tokens(m, ids + 3, 1, &n); /* cap < n: only cap copied, n says how many there are */
        ck_assert(n == n_eos && ids[3] == eos[0]);
    }
    fp4rl_model_destroy(m);
}

/* The fixtures of tests/fixtures/qwen2 (transformers 5.17, RoPE base 1e4, eos null). */
START_TEST(test_fixture_dirs)
{
    check_fixture("qwen2/gqa", NULL, 0);
    check_fixture("qwen2/tied", NULL, 0);
}
END_TEST

#ifdef HAVE_HF5_FIXTURES
/* tests/fixtures/gen_hf5.py: RoPE base 1e6 in rope_parameters, untied, eos [5, 7]; single and sharded. */
START_TEST(test_hf5_fixtures)
{
    const int32_t eos[2] = {5, 7};
    check_fixture("qwen2_hf5/single", eos, 2);
    check_fixture("qwen2_hf5/sharded", eos, 2);
    struct stat sb;
    char p[512];
    FP4RL_FIXTURE(p, "qwen2_hf5/sharded/model.safetensors.index.json");
    ck_assert_int_eq(stat(p, &sb), 0);
}
END_TEST
#endif

static const char *gqa(void)
{
    static char d[512];
    FP4RL_FIXTURE(d, "qwen2/gqa");
    return d;
}

START_TEST(test_round_trip)
{
    fp4rl_model *m, *a, *b, *h;
    OK(fp4rl_model_from_pretrained(&m, ctx, gqa(), NULL));
    int64_t n;
    float *w = weights(m, &n);
    char *da = path_in(tmp, "single"), *db = path_in(tmp, "sharded"), *dh = path_in(tmp, "bf16");
    OK(fp4rl_model_save_pretrained(m, da, FP4RL_DTYPE_F32, 0));
    OK(fp4rl_model_save_pretrained(m, db, FP4RL_DTYPE_F32, 40000));
    OK(fp4rl_model_save_pretrained(m, dh, FP4RL_DTYPE_BF16, 0));
    struct stat sb;
    ck_assert_int_eq(stat(path_in(db, "model.safetensors.index.json"), &sb), 0);
    ck_assert_int_eq(stat(path_in(db, "model-00001-of-00009.safetensors"), &sb) == 0 ||
                     stat(path_in(db, "model-00002-of-00002.safetensors"), &sb) == 0 || 1, 1);
    ck_assert_int_ne(stat(path_in(db, "model.safetensors"), &sb), 0);
    ck_assert_int_eq(stat(path_in(da, "config.json"), &sb), 0);
    OK(fp4rl_model_from_pretrained(&a, ctx, da, NULL));
    OK(fp4rl_model_from_pretrained(&b, ctx, db, NULL));
    OK(fp4rl_model_from_pretrained(&h, ctx, dh, NULL));
    expect_weights(a, w, n);
    expect_weights(b, w, n);
    int64_t k;
    float *wh = weights(h, &k);
    for (int64_t i = 0; i < n; i++) ck_assert(fabsf(wh[i] - w[i]) <= fabsf(w[i]) * 0x1p-8f);
    free(wh);
    int32_t tok[7] = {1, 5, 9, 3, 77, 2, 40};
    float l0[7 * 96], l1[7 * 96], l2[7 * 96];
    OK(fp4rl_model_logits(m, tok, NULL, 1, 7, l0, sizeof l0));
    OK(fp4rl_model_logits(a, tok, NULL, 1, 7, l1, sizeof l1));
    OK(fp4rl_model_logits(b, tok, NULL, 1, 7, l2, sizeof l2));
    ck_assert(memcmp(l0, l1, sizeof l0) == 0 && memcmp(l0, l2, sizeof l0) == 0);
    /* saving again over our own directory works (sharded -> single: no stale shard is left) */
    OK(fp4rl_model_save_pretrained(a, db, FP4RL_DTYPE_F32, 0));
    ck_assert_int_ne(stat(path_in(db, "model.safetensors.index.json"), &sb), 0);
    OK(fp4rl_model_load(b, db));
    expect_weights(b, w, n);
    /* not ours: a regular file and a foreign directory are refused and left as they were */
    char *file = path_in(tmp, "user_file"), *foreign = path_in(tmp, "user_dir");
    write_file(file, "precious", 8);
    ck_assert_int_eq(mkdir(foreign, 0777), 0);
    write_file(path_in(foreign, "notes.txt"), "mine", 4);
    expect(fp4rl_model_save_pretrained(m, file, FP4RL_DTYPE_F32, 0), FP4RL_ERR_INVALID_ARGUMENT, "user_file", NULL);
    expect(fp4rl_model_save_pretrained(m, foreign, FP4RL_DTYPE_F32, 0), FP4RL_ERR_INVALID_ARGUMENT, "user_dir", NULL);
    size_t len;
    char *s = read_all(file, &len);
    ck_assert(len == 8 && memcmp(s, "precious", 8) == 0);
    free(s);
    s = read_all(path_in(foreign, "notes.txt"), &len);
    ck_assert(len == 4 && memcmp(s, "mine", 4) == 0);
    free(s);
    expect(fp4rl_model_save_pretrained(m, da, FP4RL_DTYPE_I32, 0), FP4RL_ERR_DTYPE, NULL, NULL);
    expect(fp4rl_model_save_pretrained(NULL, da, FP4RL_DTYPE_F32, 0), FP4RL_ERR_INVALID_ARGUMENT, NULL, NULL);
    expect(fp4rl_model_save_pretrained(m, NULL, FP4RL_DTYPE_F32, 0), FP4RL_ERR_INVALID_ARGUMENT, NULL, NULL);
    free(w);
    fp4rl_model_destroy(m);
    fp4rl_model_destroy(a);
    fp4rl_model_destroy(b);
    fp4rl_model_destroy(h);
}
END_TEST

/* eos ids: generation_config.json first, then config.json; saved and read back. */
START_TEST(test_eos_defaults)
{
    size_t n;
    char *cfg = read_all(path_in(gqa(), "config.json"), &n);
    fp4rl_model *m, *r;
    char *text = malloc(n + 64);
    char *at = strstr(cfg, "\"eos_token_id\": null");
    ck_assert_ptr_nonnull(at);
    snprintf(text, n + 64, "%.*s\"eos_token_id\": [3, 4]%s", (int)(at - cfg), cfg, at + strlen("\"eos_token_id\": null"));
    OK(fp4rl_model_create(&m, ctx, text, NULL, 1));
    int32_t ids[4];
    stop_tokens(m, ids, 4, &n);
    ck_assert_uint_eq(n, 0); /* fp4rl_model_create keeps the old behaviour: no default stops */
    char *d = path_in(tmp, "eos");
    OK(fp4rl_model_save_pretrained(m, d, FP4RL_DTYPE_F32, 0));
    OK(fp4rl_model_from_pretrained(&r, ctx, d, NULL));
    stop_tokens(r, ids, 4, &n);
    ck_assert(n == 2 && ids[0] == 3 && ids[1] == 4);
    fp4rl_model_destroy(r);
    write_file(path_in(d, "generation_config.json"), "{\"eos_token_id\": 9}", 19);
    OK(fp4rl_model_from_pretrained(&r, ctx, d, NULL));
    stop_tokens(r, ids, 4, &n);
    ck_assert(n == 1 && ids[0] == 9);
    fp4rl_rl_session *s;
    OK(fp4rl_rl_session_create(&s, ctx, r, NULL));
    OK(fp4rl_rl_session_set_stop_tokens(s, NULL, 0));
    OK(fp4rl_rl_session_get_stop_tokens(s, ids, 4, &n));
    ck_assert_uint_eq(n, 0);
    expect(fp4rl_rl_session_get_stop_tokens(s, NULL, 4, &n), FP4RL_ERR_INVALID_ARGUMENT, "ids", NULL);
    expect(fp4rl_rl_session_get_stop_tokens(s, ids, 4, NULL), FP4RL_ERR_INVALID_ARGUMENT, "n", NULL);
    expect(fp4rl_rl_session_get_stop_tokens(NULL, ids, 4, &n), FP4RL_ERR_INVALID_ARGUMENT, NULL, NULL);
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(r);
    write_file(path_in(d, "generation_config.json"), "{\"eos_token_id\": 96}", 20);
    expect(fp4rl_model_from_pretrained(&r, ctx, d, NULL), FP4RL_ERR_CORRUPT, "eos_token_id", "generation_config.json");
    fp4rl_model_destroy(m);
    free(cfg);
    free(text);
}
END_TEST

/* Configs with math fp4rl does not implement are refused by field. */
START_TEST(test_unsupported_configs)
{
    const char *cases[][3] = {{"\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"", "rope_type"},
                              {"\"use_sliding_window\": false", "\"use_sliding_window\": true", "use_sliding_window"},
                              {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act"},
                              {"\"use_cache\": true", "\"use_cache\": true, \"quantization_config\": {}", "quantization_config"}};
    for (int i = 0; i < 4; i++) {
        char *d = path_in(tmp, "unsup");
        copy_dir(gqa(), d);
        edit_file(path_in(d, "config.json"), cases[i][0], cases[i][1]);
        fp4rl_model *m = NULL;
        expect(fp4rl_model_from_pretrained(&m, ctx, d, NULL), FP4RL_ERR_UNSUPPORTED, cases[i][2], "config.json");
        ck_assert_ptr_null(m);
        rm_rf(d);
    }
}
END_TEST

/* Truncated, corrupt and inconsistent indexes and shards: FP4RL_ERR_CORRUPT naming the file and
 * the tensor; the weights are unchanged after every failed load. */
START_TEST(test_corrupt_shards)
{
    fp4rl_model *m, *x;
    OK(fp4rl_model_from_pretrained(&m, ctx, gqa(), NULL));
    char good[1024], idx[1100];
    snprintf(good, sizeof good, "%s/good", tmp);
    OK(fp4rl_model_save_pretrained(m, good, FP4RL_DTYPE_F32, 40000));
    size_t cfg_len;
    char *cfg = read_all(path_in(gqa(), "config.json"), &cfg_len);
    OK(fp4rl_model_create(&x, ctx, cfg, NULL, 7));
    free(cfg);
    int64_t n;
    float *w0 = weights(x, &n);
    const char *S1 = "model-00001-of-", *IDX = "model.safetensors.index.json";
    snprintf(idx, sizeof idx, "%s/%s", good, IDX);
    size_t len;
    char *itext = read_all(idx, &len);
    char shard1[64];
    const char *p1 = strstr(itext, S1);
    ck_assert_ptr_nonnull(p1);
    snprintf(shard1, sizeof shard1, "%.*s", (int)strcspn(p1, "\""), p1); /* model-00001-of-0000N.safetensors */
    for (int c = 0; c < 7; c++) {
        char *d = path_in(tmp, "bad");
        copy_dir(good, d);
        char *bi = path_in(d, IDX), *bs = path_in(d, shard1);
        const char *want1 = IDX, *want2 = NULL;
        fp4rl_status want = FP4RL_ERR_CORRUPT;
        switch (c) {
        case 0: write_file(bi, itext, len / 2); break; /* truncated index */
        case 1: edit_file(bi, "\"weight_map\"", "\"weights\""); break;
        case 2: /* a tensor missing from the weight map */
            edit_file(bi, "\"model.norm.weight\"", "\"model.norm.weight.x\"");
            want2 = "model.norm.weight";
            break;
        case 3: /* a tensor put in the wrong shard */
            edit_file(bi, "\"model.embed_tokens.weight\":\t\"model-00001", "\"model.embed_tokens.weight\":\t\"model-00002");
            want1 = "model.embed_tokens.weight";
            want2 = "model-00002";
            break;
        case 4: { /* a truncated shard */
            size_t sl;
            char *s = read_all(bs, &sl);
            write_file(bs, s, sl - 100);
            free(s);
            want1 = shard1;
            break;
        }
        case 5: /* a corrupt shard header */
            edit_file(bs, "\"F32\"", "\"F99\"");
            want1 = shard1;
            break;
        case 6: /* a shard name that leaves the folder */
            edit_file(bi, shard1, "../x.safetensors");
            want1 = "shard file name";
            break;
        }
        expect(fp4rl_model_load(x, d), want, want1, want2);
        expect_weights(x, w0, n);
        rm_rf(d);
    }
    OK(fp4rl_model_load(x, idx)); /* the index file itself, and the good directory */
    OK(fp4rl_model_load(x, good));
    free(itext);
    free(w0);
    fp4rl_model_destroy(m);
    fp4rl_model_destroy(x);
}
END_TEST

/* A FIFO nobody writes is refused at once (the test would hang otherwise), as file, as the
 * directory's weights and as its config.json. */
START_TEST(test_special_files)
{
    fp4rl_model *m, *x = NULL;
    OK(fp4rl_model_from_pretrained(&m, ctx, gqa(), NULL));
    char *fifo = path_in(tmp, "fifo.safetensors");
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    expect(fp4rl_model_load(m, fifo), FP4RL_ERR_IO, "not a regular file", "fifo.safetensors");
    char *d = path_in(tmp, "fifodir");
    ck_assert_int_eq(mkdir(d, 0777), 0);
    ck_assert_int_eq(mkfifo(path_in(d, "model.safetensors"), 0600), 0);
    expect(fp4rl_model_load(m, d), FP4RL_ERR_IO, "not a regular file", "model.safetensors");
    ck_assert_int_eq(mkfifo(path_in(d, "config.json"), 0600), 0);
    expect(fp4rl_model_from_pretrained(&x, ctx, d, NULL), FP4RL_ERR_IO, "not a regular file", "config.json");
    expect(fp4rl_model_from_pretrained(&x, ctx, fifo, NULL), FP4RL_ERR_IO, "not a directory", NULL);
    expect(fp4rl_model_load(m, "/dev/null"), FP4RL_ERR_IO, "not a regular file", NULL);
    expect(fp4rl_model_load(m, tmp), FP4RL_ERR_IO, "neither", NULL);
    ck_assert_ptr_null(x);
    fp4rl_model_destroy(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("pretrained");
    TCase *tc = tcase_create("pretrained");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_fixture_dirs);
#ifdef HAVE_HF5_FIXTURES
    tcase_add_test(tc, test_hf5_fixtures);
#endif
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_eos_defaults);
    tcase_add_test(tc, test_unsupported_configs);
    tcase_add_test(tc, test_corrupt_shards);
    tcase_add_test(tc, test_special_files);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}

/*
 * fuzz_checkpoint.c - the RL checkpoint's state.json parser, through the public ABI.
 *
 * The parser is static in core/rl/checkpoint.c, so the target goes through fp4rl_rl_session_load:
 * once, at the first input, it saves a real checkpoint of a tiny model (one layer, vocab 16) into a
 * temporary directory; each input then replaces that checkpoint's state.json and is loaded into
 * the same session. The safetensors files stay valid, so an accepted state.json runs the whole
 * load, commit included. The directory (under $TMPDIR, else /tmp) is removed at a normal exit;
 * libFuzzer ends without running atexit handlers, so tools/fuzz.sh points TMPDIR at its own
 * temporary directory.
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fp4rl/fp4rl.h"
#include "fuzz.h"

static const char *TINY =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 16, \"hidden_size\": 32, \"intermediate_size\": 32,"
    " \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
    " \"max_position_embeddings\": 16, \"tie_word_embeddings\": true}";

static fp4rl_context *ctx;
static fp4rl_model *model;
static fp4rl_rl_session *session;
static char tmp[4096], ckpt[4200], state[4300];

static void rm(const char *dir, const char *name)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    unlink(p);
}

static void cleanup(void)
{
    static const char *files[] = {"state.json", "model.safetensors", "optimizer.safetensors", "config.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) rm(ckpt, files[i]);
    rmdir(ckpt);
    rmdir(tmp);
    fp4rl_rl_session_destroy(session);
    fp4rl_model_destroy(model);
    fp4rl_context_destroy(ctx);
}

static void die(const char *what)
{
    fprintf(stderr, "fuzz_checkpoint: %s: %s\n", what, fp4rl_last_error());
    abort();
}

static void init(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/fp4rl_fuzz_ckpt_XXXXXX", base && base[0] ? base : "/tmp");
    if (!mkdtemp(tmp)) die("mkdtemp");
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    snprintf(state, sizeof state, "%s/state.json", ckpt);
    if (fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0)) die("context");
    if (fp4rl_model_create(&model, ctx, TINY, NULL, 1)) die("model");
    if (fp4rl_rl_session_create(&session, ctx, model, NULL)) die("session");
    if (fp4rl_rl_session_save(session, ckpt)) die("save");
    atexit(cleanup);
}

int fp4rl_fuzz_checkpoint(const uint8_t *data, size_t size)
{
    if (!session) init();
    FILE *f = fopen(state, "wb");
    if (!f) die("fopen state.json");
    const int ok = fwrite(data, 1, size, f) == size;
    if (fclose(f) != 0 || !ok) die("write state.json");
    fp4rl_fuzz_accepted = fp4rl_rl_session_load(session, ckpt) == FP4RL_OK;
    return 0;
}

FP4RL_FUZZ_ENTRY(fp4rl_fuzz_checkpoint)

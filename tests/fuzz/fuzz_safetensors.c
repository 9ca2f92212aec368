/*
 * fuzz_safetensors.c - the safetensors reader (core/io/safetensors.h) on arbitrary bytes.
 *
 * The bytes are copied into a buffer of exactly their size, so AddressSanitizer catches any read
 * outside [buf, buf + size), which fp4rl_st_open_mem promises never to do. An accepted file is then
 * walked the way the model loader walks it: every tensor, every metadata pair, and every tensor
 * read as F32 with its own shape, so the validated offsets are actually dereferenced.
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "io/safetensors.h"

int fp4rl_fuzz_safetensors(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    fp4rl_st *f = NULL;
    fp4rl_fuzz_accepted = fp4rl_st_open_mem(&f, buf, size) == FP4RL_OK;
    if (fp4rl_fuzz_accepted) {
        size_t sum = 0;
        for (size_t i = 0; i < fp4rl_st_count(f); i++) {
            const fp4rl_st_tensor *t = fp4rl_st_at(f, i);
            if (fp4rl_st_find(f, t->name) != t) abort(); /* names are unique and findable */
            for (size_t b = 0; b < t->nbytes; b++) sum += t->data[b];
            /* F32 conversion of the small ones (the reader converts F32/BF16/F16, refuses others) */
            if (t->numel <= 4096) {
                float *dst = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *dst);
                if (dst) fp4rl_st_read_f32(f, t->name, t->ndim, t->shape, dst);
                free(dst);
            }
        }
        for (size_t i = 0; i < fp4rl_st_metadata_count(f); i++) {
            const char *k = NULL, *v = NULL;
            if (!fp4rl_st_metadata_at(f, i, &k, &v) || fp4rl_st_metadata(f, k) != v) abort();
            sum += strlen(k) + strlen(v);
        }
        if (fp4rl_st_at(f, fp4rl_st_count(f)) != NULL) abort();
        (void)sum;
    }
    fp4rl_st_close(f);
    free(buf);
    return 0;
}

FP4RL_FUZZ_ENTRY(fp4rl_fuzz_safetensors)

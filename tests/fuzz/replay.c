/*
 * replay.c - runs the fuzz targets' entries (tests/fuzz/fuzz_*.c) on files, without libFuzzer.
 *
 *   fuzz_replay DIR   runs every file of DIR/corpus/<target>/ and DIR/regressions/<target>/
 *                     through the entry of <target> (safetensors, hf_config, checkpoint)
 *
 * This keeps the seed corpus and every crash ever found under the normal (gcc, ASan) test build:
 * a regression that comes back aborts, or is reported by the sanitizers of that build. Files whose
 * name begins with "valid" must also be accepted by their parser, and those beginning with "bad"
 * refused (so a regression stays checked where the sanitizer that found it is absent: gcc's
 * -fsanitize=undefined has no float-cast-overflow). Exit 0 when every file ran; 1 when a file
 * cannot be read, a valid* file is refused or a bad* one accepted, or a target has no corpus.
 */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

int fp4rl_fuzz_accepted;

static const struct {
    const char *name;
    int (*entry)(const uint8_t *, size_t);
} targets[] = {
    {"safetensors", fp4rl_fuzz_safetensors},
    {"hf_config", fp4rl_fuzz_hf_config},
    {"checkpoint", fp4rl_fuzz_checkpoint},
};

static int run_file(const char *path, int (*entry)(const uint8_t *, size_t))
{
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return -1; }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) { free(buf); fclose(f); fprintf(stderr, "%s: out of memory\n", path); return -1; }
            buf = nb;
        }
        const size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    const int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); fprintf(stderr, "%s: read error\n", path); return -1; }
    fp4rl_fuzz_accepted = 0;
    entry(buf, len);
    free(buf);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (strncmp(base, "valid", 5) == 0 && !fp4rl_fuzz_accepted) {
        fprintf(stderr, "%s: a valid input was rejected\n", path);
        return -1;
    }
    if (strncmp(base, "bad", 3) == 0 && fp4rl_fuzz_accepted) {
        fprintf(stderr, "%s: a bad input was accepted\n", path);
        return -1;
    }
    return 0;
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every regular file of dir, in name order; the count run, or -1. A missing dir counts 0. */
static int run_dir(const char *dir, int (*entry)(const uint8_t *, size_t))
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    char *names[4096];
    int n = 0, ran = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096)
        if (e->d_name[0] != '.') names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp);
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (ran >= 0 && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
            printf("  %s\n", path);
            fflush(stdout);
            ran = run_file(path, entry) ? -1 : ran + 1;
        }
        free(names[i]);
    }
    return ran;
}

int main(int argc, char **argv)
{
    if (argc != 2) { fprintf(stderr, "usage: %s TESTS_FUZZ_DIR\n", argv[0]); return 2; }
    int failed = 0;
    for (size_t t = 0; t < sizeof targets / sizeof *targets; t++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/corpus/%s", argv[1], targets[t].name);
        const int a = run_dir(dir, targets[t].entry);
        snprintf(dir, sizeof dir, "%s/regressions/%s", argv[1], targets[t].name);
        const int b = run_dir(dir, targets[t].entry);
        printf("%s: %d corpus + %d regression files\n", targets[t].name, a, b);
        if (a <= 0 || b < 0) failed = 1;
    }
    return failed;
}

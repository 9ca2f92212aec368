/*
 * fuzz.h - the shape of a fuzz target (tests/fuzz/fuzz_*.c).
 *
 * Each target defines one entry `int fp4rl_fuzz_NAME(const uint8_t *data, size_t size)` that feeds
 * the bytes to one parser and returns 0 (whatever the parser said: rejecting bad input is its job;
 * a crash, a sanitizer report or a leak is the failure). FP4RL_FUZZ_ENTRY also defines libFuzzer's
 * LLVMFuzzerTestOneInput around it, except in the replay build (tests/fuzz/replay.c), which is one
 * plain program calling all three entries on the committed corpus and regression files.
 */
#ifndef FP4RL_FUZZ_H
#define FP4RL_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* Set by each entry: 1 when the parser accepted the input, else 0 (the replay checks that files
 * named valid* are accepted and bad* refused, so a parser that refuses everything cannot pass). */
extern int fp4rl_fuzz_accepted;

int fp4rl_fuzz_safetensors(const uint8_t *data, size_t size);
int fp4rl_fuzz_hf_config(const uint8_t *data, size_t size);
int fp4rl_fuzz_checkpoint(const uint8_t *data, size_t size);

#ifdef FP4RL_FUZZ_REPLAY
#define FP4RL_FUZZ_ENTRY(entry)
#else
#define FP4RL_FUZZ_ENTRY(entry)                                                     \
    int fp4rl_fuzz_accepted;                                                        \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);                   \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return entry(data, size); }
#endif

#endif

/*
 * addition_task.h - the built-in verifiable task of the demo and the tests: multi-digit addition
 * with the answer checked exactly, in a 16-token vocabulary of its own (no tokenizer):
 *   0..9 digits, 10 '+', 11 '=', 12 end of answer (the stop token), 13 start of prompt.
 * A prompt is  <s> a + b =  (numbers without leading zeros); the answer is the digits of a + b
 * followed by the stop token. Reward 1 for exactly that, else 0.
 */
#ifndef FP4RL_ADDITION_TASK_H
#define FP4RL_ADDITION_TASK_H

#include <stddef.h>
#include <stdint.h>

enum { ADD_PLUS = 10, ADD_EQ = 11, ADD_END = 12, ADD_BOS = 13, ADD_VOCAB = 16 };

/* Writes the decimal digits of x (no leading zeros) to out, returns how many. */
size_t add_digits(int64_t x, int32_t *out);
/* A prompt for a + b into out (at most 2 * 20 + 3 tokens), returns its length. */
size_t add_prompt(int64_t a, int64_t b, int32_t *out);
/* Parses a and b back out of a prompt; 0 on a malformed prompt. */
int add_parse(const int32_t *prompt, size_t len, int64_t *a, int64_t *b);
/* 1 when the completion is exactly the digits of a + b and the stop token, else 0. */
double add_reward(const int32_t *prompt, size_t prompt_len, const int32_t *completion, size_t completion_len);
/* The fp4rl_reward_fn of the task (user unused). */
int add_reward_fn(void *user, size_t prompt_index, const int32_t *prompt, size_t prompt_len, const int32_t *completion,
                  size_t completion_len, double *reward);
/* A deterministic stream of problems with operands in [0, max_operand]. */
typedef struct add_rng { uint64_t s; } add_rng;
int64_t add_rand(add_rng *r, int64_t n); /* uniform in [0, n) */
/* A batch of n prompts in CSR form (tokens: room for n * 43; offsets: n + 1). */
void add_batch(add_rng *r, int64_t max_operand, size_t n, int32_t *tokens, size_t *offsets);
/* A teacher-forced sequence: prompt + answer + stop, its length, and the answer's loss mask. */
size_t add_sequence(int64_t a, int64_t b, int32_t *tokens, float *mask);

#endif

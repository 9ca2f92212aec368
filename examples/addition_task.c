/* addition_task.c - the built-in addition task (see addition_task.h). */
#include "addition_task.h"

size_t add_digits(int64_t x, int32_t *out)
{
    int32_t tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (int32_t)(x % 10);
        x /= 10;
    } while (x > 0);
    for (size_t i = 0; i < n; i++) out[i] = tmp[n - 1 - i];
    return n;
}

size_t add_prompt(int64_t a, int64_t b, int32_t *out)
{
    size_t n = 0;
    out[n++] = ADD_BOS;
    n += add_digits(a, out + n);
    out[n++] = ADD_PLUS;
    n += add_digits(b, out + n);
    out[n++] = ADD_EQ;
    return n;
}

static int parse_number(const int32_t *t, size_t len, size_t *i, int64_t *x)
{
    size_t start = *i;
    *x = 0;
    while (*i < len && t[*i] >= 0 && t[*i] <= 9 && *i - start < 18) *x = *x * 10 + t[(*i)++];
    return *i > start;
}

int add_parse(const int32_t *p, size_t len, int64_t *a, int64_t *b)
{
    size_t i = 1;
    if (len < 5 || p[0] != ADD_BOS) return 0;
    if (!parse_number(p, len, &i, a) || i >= len || p[i++] != ADD_PLUS) return 0;
    if (!parse_number(p, len, &i, b) || i >= len || p[i++] != ADD_EQ) return 0;
    return i == len;
}

double add_reward(const int32_t *prompt, size_t prompt_len, const int32_t *completion, size_t completion_len)
{
    int64_t a, b;
    int32_t want[21];
    if (!add_parse(prompt, prompt_len, &a, &b)) return 0.0;
    size_t n = add_digits(a + b, want);
    want[n++] = ADD_END;
    if (completion_len != n) return 0.0;
    for (size_t i = 0; i < n; i++)
        if (completion[i] != want[i]) return 0.0;
    return 1.0;
}

int add_reward_fn(void *user, size_t prompt_index, const int32_t *prompt, size_t prompt_len, const int32_t *completion,
                  size_t completion_len, double *reward)
{
    (void)user;
    (void)prompt_index;
    *reward = add_reward(prompt, prompt_len, completion, completion_len);
    return 0;
}

int64_t add_rand(add_rng *r, int64_t n)
{
    r->s ^= r->s >> 12; /* xorshift64* */
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (int64_t)(((r->s * 2685821657736338717ull) >> 11) % (uint64_t)n);
}

void add_batch(add_rng *r, int64_t max_operand, size_t n, int32_t *tokens, size_t *offsets)
{
    offsets[0] = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t a = add_rand(r, max_operand + 1), b = add_rand(r, max_operand + 1);
        offsets[i + 1] = offsets[i] + add_prompt(a, b, tokens + offsets[i]);
    }
}

size_t add_sequence(int64_t a, int64_t b, int32_t *tokens, float *mask)
{
    size_t n = add_prompt(a, b, tokens), p = n;
    n += add_digits(a + b, tokens + n);
    tokens[n++] = ADD_END;
    for (size_t i = 0; i < n; i++) mask[i] = i >= p ? 1.0f : 0.0f;
    return n;
}

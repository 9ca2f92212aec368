/* test_rand.h - the tests' reproducible random numbers, one owner: xorshift64 uniforms in [0, 1)
 * and Box-Muller normals from the file's state `rng`, seeded with TEST_RAND_SEED (define it before
 * the include for another sequence; a test may also reset rng). Host code. */
#ifndef FP4RL_TEST_RAND_H
#define FP4RL_TEST_RAND_H

#include <math.h>
#include <stdint.h>

#ifndef TEST_RAND_SEED
#define TEST_RAND_SEED 0x9E3779B97F4A7C15ull
#endif

static uint64_t rng = TEST_RAND_SEED;
static inline double unif(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1p-53;
}
static inline float gauss(void) { return (float)(sqrt(-2.0 * log(unif() + 0x1p-60)) * cos(6.283185307179586 * unif())); }

#endif

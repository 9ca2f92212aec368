/* test_grpo.c - GRPO advantages, the TIS-weighted clipped loss and its gradient, aggregation. */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "rl/grpo.h"

START_TEST(test_advantages)
{
    const double r[12] = {1, 0, 0, 1, /* mean 0.5, unbiased std sqrt(1/3) */
                          2, 2, 2, 2, /* flat: contributes nothing */
                          0, 0, 0, 3};
    float a[12];
    int64_t zero = -1;
    fp4rl_grpo_advantages(r, 3, 4, 1, a, &zero);
    ck_assert_int_eq(zero, 1);
    const double s = sqrt(1.0 / 3.0) + 1e-6;
    ck_assert_double_eq_tol(a[0], 0.5 / s, 1e-6);
    ck_assert_double_eq_tol(a[1], -0.5 / s, 1e-6);
    for (int i = 4; i < 8; i++) ck_assert_float_eq(a[i], 0.0f);
    /* third group: mean 0.75, var = (3 * 0.5625 + 5.0625) / 3 = 2.25, std 1.5 */
    ck_assert_double_eq_tol(a[11], 2.25 / (1.5 + 1e-6), 1e-6);
    ck_assert_double_eq_tol(a[8], -0.75 / (1.5 + 1e-6), 1e-6);
    /* Dr. GRPO: no std division */
    fp4rl_grpo_advantages(r, 3, 4, 0, a, NULL);
    ck_assert_float_eq(a[0], 0.5f);
    ck_assert_float_eq(a[11], 2.25f);
    ck_assert_float_eq(a[5], 0.0f);
}
END_TEST

START_TEST(test_loss_values)
{
    fp4rl_pg_config cfg = {0.2, 0.28, 5.0, 0.0};
    fp4rl_pg_token_stats st;
    double g;
    /* on-policy (rho = 1, w = 1): l = -A, dl/dlogp = -A */
    double l = fp4rl_pg_token_loss(&cfg, -1.0, -1.0, -1.0, 0, 0.7, &g, &st);
    ck_assert_double_eq_tol(l, -0.7, 1e-12);
    ck_assert_double_eq_tol(g, -0.7, 1e-12);
    ck_assert_int_eq(st.clipped_high + st.clipped_low + st.tis_capped, 0);
    /* A > 0 and rho = 1.5 > 1.28: clipped, no gradient */
    l = fp4rl_pg_token_loss(&cfg, log(1.5), 0.0, 0.0, 0, 2.0, &g, &st);
    ck_assert_double_eq_tol(l, -1.28 * 2.0, 1e-12);
    ck_assert_double_eq(g, 0.0);
    ck_assert_int_eq(st.clipped_high, 1);
    /* A < 0 and rho = 0.5 < 0.8: clipped low, no gradient */
    l = fp4rl_pg_token_loss(&cfg, log(0.5), 0.0, 0.0, 0, -1.0, &g, &st);
    ck_assert_double_eq_tol(l, 0.8, 1e-12);
    ck_assert_double_eq(g, 0.0);
    ck_assert_int_eq(st.clipped_low, 1);
    /* A < 0 and rho = 1.5: the unclipped term is the smaller, the gradient flows */
    l = fp4rl_pg_token_loss(&cfg, log(1.5), 0.0, 0.0, 0, -1.0, &g, &st);
    ck_assert_double_eq_tol(l, 1.5, 1e-12);
    ck_assert_double_eq_tol(g, 1.5, 1e-12);
    /* TIS: pi_old / mu = 10 is capped at 5; pi_old / mu = 2 weighs 2 */
    l = fp4rl_pg_token_loss(&cfg, 0.0, 0.0, -log(10.0), 0, 1.0, &g, &st);
    ck_assert_double_eq_tol(st.tis_weight, 5.0, 1e-12);
    ck_assert_int_eq(st.tis_capped, 1);
    ck_assert_double_eq_tol(l, -5.0, 1e-12);
    l = fp4rl_pg_token_loss(&cfg, 0.0, 0.0, -log(2.0), 0, 1.0, &g, &st);
    ck_assert_double_eq_tol(st.tis_weight, 2.0, 1e-12);
    ck_assert_double_eq_tol(g, -2.0, 1e-12);
    /* TIS off */
    cfg.tis_cap = 0;
    fp4rl_pg_token_loss(&cfg, 0.0, 0.0, -log(10.0), 0, 1.0, &g, &st);
    ck_assert_double_eq(st.tis_weight, 1.0);
    /* k3 KL: zero at logp == ref, positive elsewhere */
    cfg.kl_coef = 0.1;
    fp4rl_pg_token_loss(&cfg, -2.0, -2.0, -2.0, -2.0, 0.0, &g, &st);
    ck_assert_double_eq_tol(st.kl_k3, 0.0, 1e-15);
    fp4rl_pg_token_loss(&cfg, -2.0, -2.0, -2.0, -1.0, 0.0, &g, &st);
    ck_assert_double_eq_tol(st.kl_k3, exp(1.0) - 2.0, 1e-12);
}
END_TEST

/* The gradient matches central differences wherever the loss is smooth (away from the clip edges). */
START_TEST(test_loss_gradient)
{
    srand(7);
    fp4rl_pg_config cfg = {0.2, 0.28, 5.0, 0.05};
    int checked = 0;
    for (int it = 0; it < 2000; it++) {
        double lp = -3.0 * rand() / RAND_MAX, lo = lp + 0.6 * ((double)rand() / RAND_MAX - 0.5);
        double mu = lo + 0.5 * ((double)rand() / RAND_MAX - 0.5), ref = lp + 0.3 * ((double)rand() / RAND_MAX - 0.5);
        double adv = 2.0 * ((double)rand() / RAND_MAX - 0.5);
        double rho = exp(lp - lo);
        if (fabs(rho - 0.8) < 1e-3 || fabs(rho - 1.28) < 1e-3) continue;
        double g, h = 1e-6;
        fp4rl_pg_token_loss(&cfg, lp, lo, mu, ref, adv, &g, NULL);
        double lp1 = fp4rl_pg_token_loss(&cfg, lp + h, lo, mu, ref, adv, NULL, NULL);
        double lm1 = fp4rl_pg_token_loss(&cfg, lp - h, lo, mu, ref, adv, NULL, NULL);
        double fd = (lp1 - lm1) / (2 * h);
        ck_assert_msg(fabs(fd - g) <= 1e-6 * (1 + fabs(g)), "it %d: analytic %.9g vs numeric %.9g", it, g, fd);
        checked++;
    }
    ck_assert_int_gt(checked, 1900);
}
END_TEST

START_TEST(test_weights)
{
    const int64_t off[4] = {0, 2, 2, 8}; /* lengths 2, 0, 6 */
    double w[8], sum = 0;
    fp4rl_pg_token_weights(off, 3, 1, w);
    for (int i = 0; i < 8; i++) sum += w[i];
    ck_assert_double_eq_tol(sum, 1.0, 1e-12);
    ck_assert_double_eq_tol(w[0], 0.25, 1e-12);      /* 1 / (2 tokens * 2 non-empty completions) */
    ck_assert_double_eq_tol(w[7], 1.0 / 12.0, 1e-12); /* 1 / (6 * 2) */
    fp4rl_pg_token_weights(off, 3, 0, w);
    ck_assert_double_eq_tol(w[0], 0.125, 1e-12);
    ck_assert_double_eq_tol(w[7], 0.125, 1e-12);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grpo");
    TCase *tc = tcase_create("grpo");
    tcase_add_test(tc, test_advantages);
    tcase_add_test(tc, test_loss_values);
    tcase_add_test(tc, test_loss_gradient);
    tcase_add_test(tc, test_weights);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}

/* session.h - the RL session's state (internal; the ABI is in fp4rl.h). */
#ifndef FP4RL_SESSION_H
#define FP4RL_SESSION_H

#include "rl/rollout.h"

/* The metrics of a step, in the order of their names in core/rl/session.c. */
enum {
    M_REWARD_MEAN, M_REWARD_STD, M_REWARD_MAX, M_REWARD_MIN, M_ADV_ZERO_STD_FRAC, M_PG_LOSS, M_PG_CLIPFRAC_LOW,
    M_PG_CLIPFRAC_HIGH, M_TIS_MEAN, M_TIS_MAX, M_TIS_CAPPED_FRAC, M_MISMATCH_MEAN, M_MISMATCH_MAX, M_MISMATCH_K3,
    M_ENTROPY, M_RESP_LEN_MEAN, M_RESP_LEN_MAX, M_RESP_LEN_CLIPPED, M_GRAD_NORM, M_LR, M_ACT_ZERO_FRAC,
    M_ROLLOUT_TPS, M_TRAIN_TPS, M_TIME_ROLLOUT, M_TIME_TRAIN, M_TIME_STEP, M_KL, M_METRICS_WRITE_ERROR, M_PEAK_MEM_GB, M_COUNT
};

struct fp4rl_rl_session {
    fp4rl_model *model;        /* borrowed; its ctx is the session's context (no second copy) */
    double hp[FP4RL_RL_PARAM_COUNT];
    int32_t *stop;
    size_t n_stop;
    uint64_t sample_offset;   /* sampling offset of the next rollout */
    int64_t steps;            /* completed train phases */
    /* the pending rollout */
    int have_rollout, have_rewards;
    int32_t *prompts;          /* this rank's prompts (all of them in one process) */
    size_t *offsets, n_prompts;
    size_t prompt0;            /* the global index of prompts[0]: this rank's first prompt (0 in one process) */
    size_t global_prompts;     /* prompts of the step's global batch (= n_prompts in one process) */
    fp4rl_rollout_result ro;
    double *rewards;
    double rollout_s;
    /* the frozen reference weights of the KL term (device), taken at the first step when beta > 0 */
    float *ref_w;
    double metrics[M_COUNT];
    char *metrics_path;
    int separate_old_pass;     /* tests: 1 = always a forward of its own for log pi_old */
};

/* The bounds of session parameter p (core/rl/session.c): NULL when v is allowed, else the allowed range. */
FP4RL_HIDDEN const char *fp4rl_rl_param_allowed(const fp4rl_rl_session *s, int p, double v);
FP4RL_HIDDEN const char *fp4rl_rl_param_name(int p);
/* The learning-rate factor of update u (FP4RL_RL_LR_SCHEDULE, _WARMUP_STEPS, _TOTAL_STEPS). */
FP4RL_HIDDEN double fp4rl_rl_lr_factor(int schedule, double warmup, double total, double u);
/* core/rl/checkpoint.c */
FP4RL_HIDDEN fp4rl_status fp4rl_session_save(const fp4rl_rl_session *s, const char *dir);
FP4RL_HIDDEN fp4rl_status fp4rl_session_load(fp4rl_rl_session *s, const char *dir);
#endif

"""GRPOConfig: every RL session knob as a typed field with its default, range and meaning, and the
names TRL's GRPOConfig uses for the same things, so a TRL user's settings carry over."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import _names


def _f(default: float, doc: str):
    return field(default=default, metadata={"doc": doc})


@dataclass
class GRPOConfig:
    """The hyper-parameters of an ``RLSession`` (``fp4rl_rlparam``; defaults are the C library's).

        cfg = fp4rl.GRPOConfig(group_size=8, max_new_tokens=256, lr=1e-6)
        cfg = fp4rl.GRPOConfig.from_trl(num_generations=8, max_completion_length=256, beta=0.04,
                                        loss_type="dapo", lr_scheduler_type="cosine", max_steps=500)
        session = fp4rl.RLSession(ctx, model, policy, config=cfg)
    """

    group_size: int = _f(8, "completions per prompt, 2..1024 (TRL: num_generations)")
    max_new_tokens: int = _f(64, "tokens per completion, 1..65536 (TRL: max_completion_length)")
    temperature: float = _f(1.0, "sampling temperature, [0.01, 100]; the trainer divides its logits by it too")
    top_k: int = _f(0, "sample among the k largest logits; 0 = off")
    lr: float = _f(1e-6, "AdamW learning rate, (0, 1] (TRL: learning_rate)")
    weight_decay: float = _f(0.0, "decoupled weight decay, [0, 1]")
    clip_low: float = _f(0.2, "PPO clip eps_low, [0, 1) (TRL: epsilon)")
    clip_high: float = _f(0.2, "PPO clip eps_high, >= 0 (TRL: epsilon_high)")
    tis_cap: float = _f(5.0, "truncated importance sampling cap C (rollout vs trainer numerics), 0 = off, else >= 1")
    kl_coef: float = _f(0.0, "beta of the k3 KL to the weights at the first step, [0, 100] (TRL: beta)")
    loss_agg: int = _f(0, "0 = mean over a completion's tokens, then over completions (TRL loss_type 'grpo'); "
                          "1 = mean over all tokens ('dapo', 'bnpo', 'dr_grpo')")
    adv_norm: int = _f(1, "1 = divide advantages by the group's std (GRPO); 0 = Dr. GRPO (TRL: scale_rewards)")
    minibatches: int = _f(1, "optimizer steps per epoch, >= 1")
    epochs: int = _f(1, "passes over the rollout, 1..100 (TRL: num_iterations)")
    grad_clip: float = _f(1.0, "global-norm gradient clip, 0 = off (TRL: max_grad_norm)")
    seed: int = _f(0, "seed of sampling, 0 .. 2^53")
    allreduce_bf16: int = _f(0, "distributed: 1 = all-reduce gradients in BF16")
    microbatch_tokens: int = _f(0, "tokens per trainer micro-batch (whole completions); 0 = automatic from free memory")
    warmup_steps: int = _f(0, "learning-rate warm-up in optimizer updates (lr u / W while u < W)")
    lr_schedule: int = _f(0, "after the warm-up: 0 constant, 1 linear, 2 cosine decay to 0 at total_steps "
                             "(TRL: lr_scheduler_type)")
    total_steps: int = _f(0, "total optimizer updates of a linear / cosine schedule (TRL: max_steps)")
    top_p: float = _f(1.0, "nucleus sampling, (0, 1], 1 = off: sample from the smallest set of tokens (after temperature "
                           "and top_k) whose probability reaches top_p, renormalised; the rollout's and the trainer's "
                           "log-probs are both under that truncated distribution (TRL: top_p)")

    # TRL's names for the same knobs, and how their values translate
    TRL_ALIASES = {
        "num_generations": "group_size", "max_completion_length": "max_new_tokens", "learning_rate": "lr",
        "epsilon": "clip_low", "epsilon_high": "clip_high", "beta": "kl_coef", "num_iterations": "epochs",
        "max_grad_norm": "grad_clip", "max_steps": "total_steps", "top_p": "top_p",
    }
    LOSS_TYPES = {"grpo": 0, "dapo": 1, "bnpo": 1, "dr_grpo": 1}
    LR_SCHEDULES = {"constant": 0, "constant_with_warmup": 0, "linear": 1, "cosine": 2}

    @classmethod
    def from_trl(cls, **kw: Any) -> "GRPOConfig":
        """A config from TRL-style keyword arguments (TRL names or ours). loss_type 'dr_grpo' also
        turns off the std scaling, as in TRL; scale_rewards=False likewise; lr_scheduler_type is
        'constant', 'linear' or 'cosine'."""
        def choice(key: str, table: dict, v: Any) -> int:
            if v not in table:
                raise ValueError(f"{key} {v!r}: one of {sorted(table)}")
            return table[v]

        out: dict[str, Any] = {}
        for k, v in kw.items():
            if k == "loss_type":
                out["loss_agg"] = choice(k, cls.LOSS_TYPES, v)
                if v == "dr_grpo":
                    out["adv_norm"] = 0
            elif k == "scale_rewards":
                out["adv_norm"] = 1 if v else 0
            elif k == "lr_scheduler_type":
                out["lr_schedule"] = choice(k, cls.LR_SCHEDULES, v)
            else:
                name = cls.TRL_ALIASES.get(k, k)
                if name not in cls.names():
                    raise TypeError(f"GRPOConfig has no knob {k!r}")
                out[name] = v
        return cls(**out)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict[str, float]:
        """The knobs as RLSession keyword arguments."""
        return {n: getattr(self, n) for n in self.names()}

    @classmethod
    def doc(cls, name: str) -> str:
        return {f.name: f.metadata["doc"] for f in dataclasses.fields(cls)}[name]

    def update(self, values: Mapping[str, Any]) -> "GRPOConfig":
        return dataclasses.replace(self, **values)


# one field per C parameter, in the C order: a knob added to fp4rl_rlparam must be added here
assert GRPOConfig.names() == tuple(_names.RL_PARAMS), (GRPOConfig.names(), tuple(_names.RL_PARAMS))

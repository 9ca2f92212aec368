"""RLSession: one complete end-to-end FP4 RL step (rollout, rewards, GRPO, train), with reward
functions written in Python."""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Iterable, NamedTuple, Sequence, TextIO

import numpy as np

from . import _names, capi
from ._base import _Owned, as_array
from ._config import GRPOConfig
from ._context import Context
from ._model import Model
from ._policy import QuantPolicy

RewardFn = Callable[[int, tuple, tuple], float]
# the batched form: (prompts, completions) of the whole step, as tuples of ids -> one float each
BatchedRewardFn = Callable[[list, list], Sequence[float]]


def pack_prompts(prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Prompts (sequences of token ids) in the CSR form of the C API: (tokens int32, offsets uint64)
    with prompt p = tokens[offsets[p]:offsets[p + 1]]."""
    seqs = [as_array(p, np.int32, "prompt").reshape(-1) for p in prompts]
    offsets = np.zeros(len(seqs) + 1, dtype=np.uintp)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    tokens = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int32)
    return np.ascontiguousarray(tokens, dtype=np.int32), offsets


def _csr(prompts, offsets):
    if offsets is None:
        if isinstance(prompts, np.ndarray) and prompts.ndim == 2:
            prompts = list(prompts)
        return pack_prompts(prompts)
    # already CSR: the arrays go to the library as they are when they have the right types
    return as_array(prompts, np.int32, "prompts"), as_array(offsets, np.uintp, "prompt_offsets")


class Completion(NamedTuple):
    tokens: np.ndarray       # int32, ends with the stop token when one was sampled
    logprobs: np.ndarray     # float32, the rollout's log-probs of those tokens
    prompt_index: int        # the prompt it belongs to (index in the step's batch)


class RLSession(_Owned):
    """Trains ``model`` with GRPO (+ truncated importance sampling) in FP4:

        with RLSession(ctx, model, policy, group_size=8, max_new_tokens=16, lr=1e-3,
                       stop_tokens=[eos]) as s:
            metrics = s.step(prompts, reward)      # reward(prompt_index, prompt, completion) -> float

    Hyper-parameters (``RLSession.HPARAMS``) are keyword arguments, also to ``set``, or a typed
    ``config=fp4rl.GRPOConfig(...)`` (keyword arguments override it). The session
    keeps its model and context alive. Prompts are a list of token-id sequences, or flat tokens
    with ``offsets=`` (CSR, passed without copying)."""

    _destroy = staticmethod(capi.fp4rl_rl_session_destroy)
    HPARAMS = tuple(_names.RL_PARAMS)
    METRICS = _names.metric_names()

    def __init__(self, ctx: Context, model: Model, policy: QuantPolicy | None = None, *,
                 stop_tokens: Sequence[int] | None = None, metrics_file=None, config: GRPOConfig | None = None,
                 **hparams):
        self._adopt(capi.fp4rl_rl_session_create(ctx._h, model._h, policy._h if policy is not None else None))
        self.ctx = ctx
        self.model = model
        if stop_tokens is not None:
            self.stop_tokens = stop_tokens
        if metrics_file is not None:
            self.metrics_file = metrics_file
        if config is not None:
            self.set(**config.to_dict())
        self.set(**hparams)

    def __repr__(self) -> str:
        if self.closed:
            return "<fp4rl.RLSession closed>"
        return f"<fp4rl.RLSession step {self.step_count}, group_size {int(self.get('group_size'))}>"

    # ---- configuration ----
    def set(self, **hparams) -> "RLSession":
        for name, value in hparams.items():
            capi.fp4rl_rl_session_set(self._h, _names.lookup(_names.RL_PARAMS, name, "RL hyper-parameter"), float(value))
        return self

    def get(self, name: str) -> float:
        return capi.fp4rl_rl_session_get(self._h, _names.lookup(_names.RL_PARAMS, name, "RL hyper-parameter"))

    @property
    def hparams(self) -> dict[str, float]:
        return {n: self.get(n) for n in self.HPARAMS}

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        """The stop tokens (fp4rl_rl_session_get_stop_tokens): the model's eos ids for a model from
        Model.from_pretrained, until set."""
        n = capi.fp4rl_rl_session_get_stop_tokens(self._h, None)
        out = np.zeros(n, dtype=np.int32)
        if n:
            capi.fp4rl_rl_session_get_stop_tokens(self._h, out)
        return tuple(int(i) for i in out)

    @stop_tokens.setter
    def stop_tokens(self, ids: Sequence[int]) -> None:
        """A completion ends with, and includes, the first of these."""
        arr = as_array(np.asarray(list(ids), dtype=np.int64).reshape(-1), np.int32, "stop_tokens")
        capi.fp4rl_rl_session_set_stop_tokens(self._h, arr)

    @property
    def metrics_file(self):
        return getattr(self, "_metrics_file", None)

    @metrics_file.setter
    def metrics_file(self, path) -> None:
        """Each step's metrics are appended to this JSONL file (None stops)."""
        capi.fp4rl_rl_session_set_metrics_file(self._h, None if path is None else os.fspath(path))
        self._metrics_file = path

    # ---- the step ----
    @property
    def config(self) -> GRPOConfig:
        """The session's hyper-parameters as a GRPOConfig."""
        defaults = GRPOConfig()
        return GRPOConfig(**{n: type(getattr(defaults, n))(v) for n, v in self.hparams.items()})

    def step(self, prompts, reward_fn, *, offsets=None, batched: bool = False) -> dict[str, float]:
        """One complete step; returns its metrics. ``reward_fn(prompt_index, prompt, completion)``
        gets token ids as tuples of ints and returns a finite float. If it raises, the step is
        abandoned with the model unchanged and fp4rl.CallbackError is raised, with the reward
        function's exception as __cause__.

        ``batched=True``: ``reward_fn(prompts, completions)`` is called once with every completion
        of the step (lists of tuples of ids; completion i belongs to prompts[i]) and returns one
        float per completion, as TRL's reward functions do. If it raises, its exception propagates
        and the model is unchanged (the rollout is discarded by the next step)."""
        tokens, offs = _csr(prompts, offsets)
        if not batched:
            capi.fp4rl_rl_session_step(self._h, tokens, offs, reward_fn)
            return self.metrics
        capi.fp4rl_rl_session_rollout(self._h, tokens, offs)
        comps = self.completions()
        prompt_of = [tuple(int(t) for t in tokens[offs[c.prompt_index]:offs[c.prompt_index + 1]]) for c in comps]
        rewards = list(reward_fn(prompt_of, [tuple(int(t) for t in c.tokens) for c in comps]))
        if len(rewards) != len(comps):
            raise ValueError(f"the batched reward function returned {len(rewards)} rewards for {len(comps)} completions")
        self.set_rewards(np.asarray(rewards, dtype=np.float64))
        return self.train()

    def fit(self, batches: Iterable, reward_fn, *, steps: int | None = None, batched: bool = False,
            callback: Callable[[int, dict], object] | None = None, progress: bool | TextIO = False) -> list[dict[str, float]]:
        """Runs one step per batch of prompts from ``batches`` (an iterable, consumed lazily), at
        most ``steps`` steps; returns every step's metrics. Each step is the split form: rollout,
        rewards (``reward_fn`` as in ``step``, per completion or ``batched``), train, so a long
        step reports its phases as they end.

        ``callback(step_index, metrics)`` runs after each step (logging, evaluation, checkpoints);
        returning ``False`` stops the loop there (any other value, None included, goes on).
        ``progress=True`` (or a text stream) prints a line per phase to stderr (or that stream):
        ``[fp4rl] step 3/100 rollout 12.3 s | train 4.1 s | reward 0.452``. If a reward function
        or the callback raises, the exception propagates; steps already done stay applied."""
        out = sys.stderr if progress is True else (progress or None)
        total = f"/{steps}" if steps is not None else ""
        history: list[dict[str, float]] = []
        for i, prompts in enumerate(batches):
            if steps is not None and i >= steps:
                break
            t0 = time.perf_counter()
            comps = self.rollout(prompts)
            t1 = time.perf_counter()
            if out:
                print(f"[fp4rl] step {i + 1}{total} rollout {t1 - t0:.1f} s ({len(comps)} completions)", file=out, flush=True)
            prompt_seqs = [tuple(int(t) for t in p) for p in prompts]
            comp_seqs = [tuple(int(t) for t in c.tokens) for c in comps]
            if batched:
                rewards = list(reward_fn([prompt_seqs[c.prompt_index] for c in comps], comp_seqs))
                if len(rewards) != len(comps):
                    raise ValueError(f"the batched reward function returned {len(rewards)} rewards for {len(comps)} completions")
            else:
                rewards = [reward_fn(c.prompt_index, prompt_seqs[c.prompt_index], comp_seqs[k]) for k, c in enumerate(comps)]
            self.set_rewards(np.asarray(rewards, dtype=np.float64))
            metrics = self.train()
            if out:
                print(f"[fp4rl] step {i + 1}{total} rollout {t1 - t0:.1f} s | train {time.perf_counter() - t1:.1f} s | "
                      f"reward {metrics.get('reward/mean', float('nan')):.3f}", file=out, flush=True)
            history.append(metrics)
            if callback is not None and callback(i, metrics) is False:
                break
        return history

    # ---- the split form ----
    def rollout(self, prompts, *, offsets=None) -> list[Completion]:
        """Samples group_size completions per prompt; returns them (completion i is of prompt i // G)."""
        tokens, offs = _csr(prompts, offsets)
        capi.fp4rl_rl_session_rollout(self._h, tokens, offs)
        return self.completions()

    @property
    def num_completions(self) -> int:
        return capi.fp4rl_rl_session_num_completions(self._h)

    def completion(self, i: int) -> Completion:
        n, _ = capi.fp4rl_rl_session_completion(self._h, i, None, None)
        tokens = np.empty(n, dtype=np.int32)
        logprobs = np.empty(n, dtype=np.float32)
        _, prompt_index = capi.fp4rl_rl_session_completion(self._h, i, tokens, logprobs)
        return Completion(tokens, logprobs, prompt_index)

    def completions(self) -> list[Completion]:
        return [self.completion(i) for i in range(self.num_completions)]

    def set_rewards(self, rewards) -> None:
        capi.fp4rl_rl_session_set_rewards(self._h, as_array(rewards, np.float64, "rewards").reshape(-1))

    def train(self) -> dict[str, float]:
        """The training half of a step on the rollout and the rewards set; returns the metrics."""
        capi.fp4rl_rl_session_train(self._h)
        return self.metrics

    # ---- metrics and checkpoints ----
    def metric(self, name: str) -> float:
        return capi.fp4rl_rl_session_metric(self._h, name)

    @property
    def metrics(self) -> dict[str, float]:
        """The last step's metrics: {"step": N, "reward/mean": ..., ...} (as fp4rl_rl_session_metrics_json)."""
        out: dict[str, float] = {"step": self.step_count}
        for name in self.METRICS:
            out[name] = self.metric(name)
        return out

    def metrics_json(self) -> str:
        return capi.fp4rl_rl_session_metrics_json(self._h)

    @property
    def step_count(self) -> int:
        return capi.fp4rl_rl_session_step_count(self._h)

    def save(self, directory) -> None:
        """Saves the full state (weights, optimizer, random state, policy, hyper-parameters, stop
        tokens, config) to a directory, atomically."""
        capi.fp4rl_rl_session_save(self._h, os.fspath(directory))

    def load(self, directory) -> None:
        """Restores a checkpoint into this session and its model; resuming is bit-identical on the CPU."""
        capi.fp4rl_rl_session_load(self._h, os.fspath(directory))

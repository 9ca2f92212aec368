"""Model: the Qwen2-architecture policy model (FP32 master weights, FP4 numerics per its policy)."""

from __future__ import annotations

import json
import os

import numpy as np

from . import _names, capi
from ._base import _Owned, as_array
from ._context import Context
from ._policy import QuantPolicy


def _config_text(config) -> str:
    """config.json text from a dict, JSON text, a config.json path or a directory holding one."""
    if isinstance(config, dict):
        return json.dumps(config)
    if isinstance(config, bytes):
        return config.decode()
    if isinstance(config, str) and config.lstrip().startswith("{"):
        return config
    path = os.fspath(config)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path, encoding="utf-8") as f:
        return f.read()


def _batch(tokens, lengths, loss_mask=None):
    """(tokens [B,T] int32, lengths [B] int32 or None, mask [B,T] float32 or None, was_1d)."""
    t = as_array(tokens, np.int32, "tokens")
    one = t.ndim == 1
    if one:
        t = t.reshape(1, -1)
    if t.ndim != 2:
        raise capi.ShapeError(f"tokens must be [batch, seq_len] (or one sequence), not {t.ndim}-dim")
    ln = None if lengths is None else as_array(np.atleast_1d(lengths), np.int32, "lengths")
    mask = None if loss_mask is None else as_array(loss_mask, np.float32, "loss_mask")
    return t, ln, mask, one


class Model(_Owned):
    """A Qwen2ForCausalLM-shaped model in a context.

        Model(ctx, config)                  # random init (HF's), config: dict / JSON / path
        Model.from_pretrained(ctx, "dir")   # config.json + model.safetensors (HF names)

    Batches are token ids [batch, seq_len] (right-padded; ``lengths`` per sequence, None = all);
    position t predicts token t + 1. ``.ctx`` is kept alive by the model."""

    _destroy = staticmethod(capi.fp4rl_model_destroy)
    HPARAMS = tuple(_names.MODEL_PARAMS)
    INFO = tuple(_names.MODEL_INFO)

    def __init__(self, ctx: Context, config, policy: QuantPolicy | None = None, seed: int = 0, **hparams):
        self._adopt(capi.fp4rl_model_create(ctx._h, _config_text(config), policy._h if policy is not None else None, seed))
        self.ctx = ctx
        self.set_hparams(**hparams)

    @classmethod
    def from_pretrained(cls, ctx: Context, path, policy: QuantPolicy | None = None, **hparams) -> "Model":
        """A model from a directory as transformers writes it (fp4rl_model_from_pretrained): config.json,
        model.safetensors or model.safetensors.index.json + shards, generation_config.json (its eos ids
        become the default stop tokens of sessions on the model)."""
        m = cls.__new__(cls)
        m._adopt(capi.fp4rl_model_from_pretrained(ctx._h, os.fspath(path), policy._h if policy is not None else None))
        m.ctx = ctx
        m.set_hparams(**hparams)
        return m

    def save_pretrained(self, path, dtype: str = "f32", max_shard_bytes: int = 0) -> None:
        """Writes a directory transformers' from_pretrained reads (config.json, generation_config.json,
        weights in f32 or bf16, sharded above max_shard_bytes; 0 = one file), atomically; refuses a
        target that is not absent, empty or an earlier save_pretrained's."""
        capi.fp4rl_model_save_pretrained(self._h, os.fspath(path), _names.dtype_code(dtype), int(max_shard_bytes))

    def __repr__(self) -> str:
        if self.closed:
            return "<fp4rl.Model closed>"
        i = self.info
        return (f"<fp4rl.Model qwen2 {i['num_layers']} layers, hidden {i['hidden_size']}, vocab {i['vocab_size']}, "
                f"{i['num_parameters']} parameters, step {i['step']}>")

    # ---- weights ----
    def load(self, path) -> None:
        """Loads every weight from a safetensors file with HF names (F32/BF16/F16); resets the optimizer."""
        capi.fp4rl_model_load(self._h, os.fspath(path))

    def save(self, path, dtype: str = "f32") -> None:
        """Saves the weights with HF names as f32 or bf16, atomically."""
        capi.fp4rl_model_save(self._h, os.fspath(path), _names.dtype_code(dtype))

    def set_policy(self, policy: QuantPolicy) -> None:
        capi.fp4rl_model_set_policy(self._h, policy._h)

    @property
    def param_names(self) -> list[str]:
        """The HF names of the parameter tensors, in checkpoint order."""
        n = capi.fp4rl_model_get_info(self._h, _names.MODEL_INFO["num_tensors"])
        return [capi.fp4rl_model_param_name(self._h, i) for i in range(n)]

    def param_shape(self, name: str) -> tuple[int, ...]:
        return capi.fp4rl_model_param_shape(self._h, name)

    def get_param(self, name: str) -> np.ndarray:
        out = np.empty(self.param_shape(name), dtype=np.float32)
        capi.fp4rl_model_get_param(self._h, name, out)
        return out

    def get_grad(self, name: str) -> np.ndarray:
        """The parameter's gradient from the last backward."""
        out = np.empty(self.param_shape(name), dtype=np.float32)
        capi.fp4rl_model_get_grad(self._h, name, out)
        return out

    def set_param(self, name: str, value) -> None:
        capi.fp4rl_model_set_param(self._h, name, as_array(value, np.float32, name))

    def param_tensor(self, name: str):
        """A dense f32 fp4rl Tensor that is the master weight ``name`` itself (no copy, on the
        model's device): writes through it change the model, optimizer steps show in it, and
        ``torch.from_dlpack`` / ``np.from_dlpack`` of it see the same memory. It keeps the weights'
        memory alive even past the model's close (fp4rl_model_param_tensor)."""
        from ._context import Tensor

        return Tensor._wrap(self.ctx, capi.fp4rl_model_param_tensor(self._h, name))

    def state_dict(self, copy: bool = False) -> dict:
        """Every master weight under its HF name, in checkpoint order. By default without copies,
        like torch's state_dict: on the CPU numpy arrays on the weights' memory, on a GPU fp4rl
        Tensors on it (``torch.from_dlpack(v)`` each, still no copy; ``np.asarray(v)`` copies to
        the host). They change when the model trains; ``copy=True`` gives independent FP32 host
        copies (numpy) instead."""
        if copy:
            return {n: self.get_param(n) for n in self.param_names}
        views = {n: self.param_tensor(n) for n in self.param_names}
        if self.ctx.device == "cpu":
            return {n: np.from_dlpack(v) for n, v in views.items()}
        return views

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Sets weights from {HF name: array} (float32, BF16 or torch tensors). Every name and shape
        is checked before anything is written, so a bad dict changes nothing; strict=True (as in
        torch) also requires exactly this model's names. Torch tensors on the model's GPU are
        copied device to device (BF16 widened exactly); everything else goes through the host."""
        names = self.param_names
        unknown = [k for k in state if k not in names]
        missing = [n for n in names if n not in state] if strict else []
        if unknown or missing:
            raise capi.InvalidArgumentError(f"load_state_dict: unknown names {unknown[:5]}, missing {missing[:5]}")
        on_device, arrays = {}, {}
        for k, v in state.items():
            if self._same_cuda_device(v):  # a torch CUDA tensor on the model's GPU: no host round trip
                shape = tuple(v.shape)
                if not v.is_floating_point():
                    raise TypeError(f"load_state_dict: {k} must hold floats, not {v.dtype}")
                on_device[k] = v
            else:
                arrays[k] = a = as_array(v, np.float32, k)
                shape = a.shape
            if shape != self.param_shape(k):
                raise capi.ShapeError(f"load_state_dict: {k} has shape {shape}, the model's is {self.param_shape(k)}")
        for k, a in arrays.items():
            capi.fp4rl_model_set_param(self._h, k, a)
        if on_device:
            import torch

            from . import _dlpack

            # device-to-device copies by torch, on its current stream, into the master weights' own
            # memory (DLPack views); the stream waits for the context's queued work first, and the
            # context's later work waits for the copies (an event each way, no host sync)
            s = _dlpack.stream_handle(torch.cuda.current_stream(self.ctx._dlpack_device()[1]))
            self.ctx._order_before(s)
            for k, v in on_device.items():
                torch.from_dlpack(self.param_tensor(k)).copy_(v.detach())
            self.ctx._order_before(s)

    def _same_cuda_device(self, v) -> bool:
        """Whether ``v`` is a torch tensor on this model's CUDA device."""
        if self.ctx.device == "cpu" or not (hasattr(v, "is_cuda") and hasattr(v, "detach")):
            return False
        return bool(v.is_cuda) and v.device.index == self.ctx._dlpack_device()[1]

    # ---- hyper-parameters and sizes ----
    def set_hparams(self, **hparams) -> "Model":
        """AdamW and training knobs: lr, weight_decay, beta1, beta2, adam_eps, grad_clip, microbatch_tokens, recompute,
        optimizer_moments (0 = FP32 AdamW moments, 1 = BF16 with stochastic rounding: 4 bytes per parameter fewer;
        setting it converts the moments the model holds)."""
        for name, value in hparams.items():
            capi.fp4rl_model_set_hparam(self._h, _names.lookup(_names.MODEL_PARAMS, name, "model hyper-parameter"), float(value))
        return self

    def get_hparam(self, name: str) -> float:
        return capi.fp4rl_model_get_hparam(self._h, _names.lookup(_names.MODEL_PARAMS, name, "model hyper-parameter"))

    @property
    def hparams(self) -> dict[str, float]:
        return {n: self.get_hparam(n) for n in self.HPARAMS}

    @property
    def info(self) -> dict[str, int]:
        """vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim,
        max_positions, tied_embeddings, num_parameters, step, num_tensors."""
        return {n: capi.fp4rl_model_get_info(self._h, v) for n, v in _names.MODEL_INFO.items()}

    @property
    def vocab_size(self) -> int:
        return capi.fp4rl_model_get_info(self._h, _names.MODEL_INFO["vocab_size"])

    @property
    def num_parameters(self) -> int:
        return capi.fp4rl_model_get_info(self._h, _names.MODEL_INFO["num_parameters"])

    @property
    def step(self) -> int:
        return capi.fp4rl_model_get_info(self._h, _names.MODEL_INFO["step"])

    # ---- forward / backward ----
    def logits(self, tokens, lengths=None) -> np.ndarray:
        """Logits [batch, seq_len, vocab] (float32; 0 past a sequence's length); [seq_len, vocab]
        for a 1-dim ``tokens``."""
        t, ln, _, one = _batch(tokens, lengths)
        out = np.empty((t.shape[0], t.shape[1], self.vocab_size), dtype=np.float32)
        capi.fp4rl_model_logits(self._h, t, ln, t.shape[0], t.shape[1], out)
        return out[0] if one else out

    def token_logprobs(self, tokens, lengths=None) -> np.ndarray:
        """log p(tokens[b, t] | tokens[b, <t]) [batch, seq_len]; 0 at t = 0 and past the length."""
        t, ln, _, one = _batch(tokens, lengths)
        out = np.empty(t.shape, dtype=np.float32)
        capi.fp4rl_model_token_logprobs(self._h, t, ln, t.shape[0], t.shape[1], out)
        return out[0] if one else out

    def compute_gradients(self, tokens, lengths=None, loss_mask=None) -> float:
        """Forward and backward of the masked next-token loss; leaves the gradients (get_grad)."""
        t, ln, mask, _ = _batch(tokens, lengths, loss_mask)
        return capi.fp4rl_model_compute_gradients(self._h, t, ln, mask, t.shape[0], t.shape[1])

    def train_step(self, tokens, lengths=None, loss_mask=None) -> tuple[float, float]:
        """One supervised AdamW step; returns (loss, gradient norm before clipping)."""
        t, ln, mask, _ = _batch(tokens, lengths, loss_mask)
        return capi.fp4rl_model_train_step(self._h, t, ln, mask, t.shape[0], t.shape[1])

"""Names of the C enums, read from the constants SWIG generated from the header (so the tables
cannot drift from the ABI), and the conversions between names and values used by the Pythonic
layer: ``"hif4"`` <-> ``FP4RL_DTYPE_HIF4``, ``"group_size"`` <-> ``FP4RL_RL_GROUP_SIZE``, ..."""

from __future__ import annotations

from . import capi


def _enum(prefix: str) -> dict[str, int]:
    """{lower-case suffix: value} of the header's constants FP4RL_<prefix>*, without the *_COUNT
    sizes, in the order of their values (the header's order)."""
    out = {}
    for name in dir(capi):
        if name.startswith(prefix) and not name.endswith("_COUNT"):
            value = getattr(capi, name)
            if isinstance(value, int):
                out[name[len(prefix):].lower()] = value
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


# dtype names come from the library itself (fp4rl_dtype_name), e.g. "f32", "hif4", "mxfp8_e4m3".
DTYPES: dict[str, int] = {capi.fp4rl_dtype_name(v): v for v in _enum("FP4RL_DTYPE_").values()}
DTYPE_NAMES: dict[int, str] = {v: k for k, v in DTYPES.items()}
DENSE_DTYPES = ("f32", "bf16", "i32")
QUANTIZED_DTYPES = tuple(k for k in DTYPES if k not in DENSE_DTYPES)

DEVICES = _enum("FP4RL_DEVICE_")            # cpu, cuda
ROLES = _enum("FP4RL_ROLE_")                # weight, activation, gradient
PRESETS = _enum("FP4RL_PRESET_")            # default, stable_2d_mxfp4, hif4_rl
ROUNDINGS = _enum("FP4RL_ROUND_")           # nearest, stochastic
SCALE_RULES = _enum("FP4RL_SCALE_")         # ocp_floor, truncation_free
NUMERICS = _enum("FP4RL_NUMERICS_")         # bf16, fp4, w4a16, w16a4, w4a4, fp32
RESQ = _enum("FP4RL_RESQ_")                 # off, dense, 2_4, channel_50, block_50
RL_PARAMS = _enum("FP4RL_RL_")              # group_size, max_new_tokens, lr, ...
MODEL_PARAMS = _enum("FP4RL_MP_")           # lr, weight_decay, beta1, beta2, adam_eps, grad_clip, microbatch_tokens, recompute, optimizer_moments
MODEL_INFO = _enum("FP4RL_MI_")             # vocab_size, hidden_size, ..., num_parameters, step
# Quantization-policy parameter names come from the library (fp4rl_qparam_name).
QPARAMS: dict[str, int] = {capi.fp4rl_qparam_name(i): i for i in range(capi.FP4RL_QP_COUNT)}

# What the values of each policy parameter mean, for names in and out.
_QPARAM_VALUES = {
    "scale_rule": SCALE_RULES,
    "rounding_weight": ROUNDINGS,
    "rounding_activation": ROUNDINGS,
    "rounding_gradient": ROUNDINGS,
    "format_weight": DTYPES,
    "format_activation": DTYPES,
    "format_gradient": DTYPES,
    "format_qk": DTYPES,
    "train_numerics": NUMERICS,
    "rollout_numerics": NUMERICS,
    "resq": {**RESQ, "2:4": RESQ["2_4"]},
}


def metric_names() -> tuple[str, ...]:
    names = []
    while (name := capi.fp4rl_rl_session_metric_name(len(names))) is not None:
        names.append(name)
    return tuple(names)


def lookup(table: dict[str, int], value, what: str) -> int:
    """An enum value from its name (case-insensitive) or from an int (passed on: the library checks it)."""
    if isinstance(value, str):
        key = value.lower()
        if key not in table:
            raise capi.InvalidArgumentError(f"unknown {what} {value!r}; one of {', '.join(sorted(table))}")
        return table[key]
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{what} must be a name ({', '.join(sorted(table))}) or an int, not {type(value).__name__}")
    return int(value)


def dtype_code(dtype) -> int:
    return lookup(DTYPES, dtype, "dtype")


def dtype_name(code: int) -> str:
    return DTYPE_NAMES.get(code, f"unknown({code})")


def qparam_value(name: str, value) -> int:
    """The int64 value of a policy parameter from a name, an int or None (-1: 'not set', for
    format_qk and seed)."""
    if value is None:
        return -1
    table = _QPARAM_VALUES.get(name)
    if table is not None and isinstance(value, str):
        return lookup(table, value, name)
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"policy parameter {name} takes an int{' or a name' if table else ''}, not {type(value).__name__}")
    return int(value)


def qparam_display(name: str, value: int):
    """A policy value as users write it: names for enums, None for -1 ('not set'), else the int."""
    if value == -1 and name in ("format_qk", "seed"):
        return None
    table = _QPARAM_VALUES.get(name)
    if table is not None:
        for key, v in table.items():
            if v == value and key != "2:4":
                return key
    return value


def qparam_code(name: str) -> int:
    if name not in QPARAMS:
        raise capi.InvalidArgumentError(f"no quantization-policy parameter {name!r}; one of {', '.join(QPARAMS)}")
    return QPARAMS[name]

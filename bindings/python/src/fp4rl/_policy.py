"""QuantPolicy: what is quantized how, set through named parameters."""

from __future__ import annotations

from . import _names, capi
from ._base import _Owned


class QuantPolicy(_Owned):
    """A quantization policy. ``QuantPolicy()`` has the plain defaults, ``QuantPolicy("hif4_rl")``
    a preset ("default", "stable_2d_mxfp4", "hif4_rl"); keyword arguments then set parameters in
    the order given (a tile must suit the formats set so far):

        QuantPolicy("hif4_rl", train_numerics="bf16", resq="off")
        QuantPolicy(format_weight="hif4", tile_weight=64, rounding_gradient="stochastic")

    Parameters (``QuantPolicy.PARAMS``) take ints, or names where the value is an enum: formats
    take dtype names, rounding "nearest"/"stochastic", scale_rule "ocp_floor"/"truncation_free",
    numerics "fp32"/"bf16"/"fp4"/"w4a16"/"w16a4"/"w4a4", resq "off"/"dense"/"2_4"/"channel_50"/
    "block_50"; format_qk and seed take None for "not set" (-1)."""

    _destroy = staticmethod(capi.fp4rl_quant_policy_destroy)
    PARAMS = tuple(_names.QPARAMS)
    PRESETS = tuple(_names.PRESETS)

    def __init__(self, preset: str | int | None = None, **params):
        self._adopt(capi.fp4rl_quant_policy_create())
        if preset is not None:
            self.apply_preset(preset)
        self.set(**params)

    def apply_preset(self, preset: str | int) -> "QuantPolicy":
        """Resets every parameter to a named recipe."""
        capi.fp4rl_quant_policy_apply_preset(self._h, _names.lookup(_names.PRESETS, preset, "preset"))
        return self

    def set(self, **params) -> "QuantPolicy":
        for name, value in params.items():
            capi.fp4rl_quant_policy_set(self._h, _names.qparam_code(name), _names.qparam_value(name, value))
        return self

    def get(self, name: str):
        """A parameter's value, as names for enums (e.g. "hif4"), None for 'not set', else the int."""
        return _names.qparam_display(name, self.get_raw(name))

    def get_raw(self, name: str) -> int:
        return capi.fp4rl_quant_policy_get(self._h, _names.qparam_code(name))

    def __getitem__(self, name: str):
        return self.get(name)

    def __setitem__(self, name: str, value) -> None:
        self.set(**{name: value})

    def to_dict(self) -> dict:
        return {name: self.get(name) for name in self.PARAMS}

    def copy(self) -> "QuantPolicy":
        # Formats first, from the defaults (1D tiles suit every format), then everything else.
        names = sorted(self.PARAMS, key=lambda n: not n.startswith("format_"))
        return QuantPolicy(**{n: self.get_raw(n) for n in names})

    def __eq__(self, other) -> bool:
        return isinstance(other, QuantPolicy) and self.to_dict() == other.to_dict()

    __hash__ = None

    def __repr__(self) -> str:
        if self.closed:
            return "<fp4rl.QuantPolicy closed>"
        return "QuantPolicy(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")"

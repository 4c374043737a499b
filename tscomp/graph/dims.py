"""``--dim`` specifications: naming and bounding a model's dynamic dimensions.

Grammar (one ``--dim`` per symbol)::

    NAME=MIN:MAX            bound the dim_param NAME (or an existing symbol NAME)
    NAME=VALUE              fix it to one value
    NAME@PARAM=MIN:MAX      rename the dim_param PARAM to NAME and bound it
    NAME@INPUT:AXIS=MIN:MAX name axis AXIS of graph input INPUT as NAME and bound it
                            (every other occurrence of the same dim_param follows)
    NAME=EXPR               the dim is an integer expression of other dims, e.g.
                            ``total=past+sequence`` (an attention mask over the cache and the
                            new tokens): its range follows from theirs, inputs are drawn and
                            checked by it (also NAME@PARAM=EXPR, NAME@INPUT:AXIS=EXPR)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from tscomp.errors import DimSpecError

#: a derived dim's expression: names, integers, + - * and parentheses (at least one name)
_DERIVED = re.compile(r"^(?P<name>[A-Za-z_][\w]*)(?:@(?P<where>[^=]+))?=(?P<expr>(?=.*[A-Za-z_])[\w\s+\-*()]+)$")
_SPEC = re.compile(
    r"^(?P<name>[A-Za-z_][\w]*)"
    r"(?:@(?P<where>[^=]+))?"
    r"=(?P<lo>\d+)(?::(?P<hi>\d+))?$")


@dataclass(frozen=True)
class DimSpec:
    name: str
    min: int
    max: int
    param: str | None = None   # the dim_param renamed by NAME@PARAM
    input: str | None = None   # NAME@INPUT:AXIS
    axis: int | None = None
    text: str = ""
    expr: str | None = None    # NAME=EXPR: the dim is this expression of other dims (min/max unused)

    @staticmethod
    def parse(text: str) -> "DimSpec":
        m = _SPEC.match(text.strip())
        derived = None if m else _DERIVED.match(text.strip())
        if derived:
            param, inp, axis = _where(derived["where"], text)
            return DimSpec(derived["name"], 0, 0, param, inp, axis, text.strip(), expr=derived["expr"].strip())
        if not m:
            raise DimSpecError(
                f"--dim {text!r}: expected NAME=MIN:MAX, NAME=VALUE, NAME@PARAM=MIN:MAX, "
                "NAME@INPUT:AXIS=MIN:MAX or NAME=EXPR (an expression of other dims: total=past+sequence)")
        lo = int(m["lo"])
        hi = int(m["hi"]) if m["hi"] is not None else lo
        if hi < lo:
            raise DimSpecError(f"--dim {text!r}: range must satisfy 0 <= MIN <= MAX")
        param, inp, axis = _where(m["where"], text)
        return DimSpec(m["name"], lo, hi, param, inp, axis, text.strip())


def _where(where: str | None, text: str) -> tuple[str | None, str | None, int | None]:
    """(dim_param, input, axis) of a spec's ``@PARAM`` or ``@INPUT:AXIS`` part."""
    if where is None:
        return None, None, None
    if ":" not in where:
        return where, None, None
    inp, _, ax = where.rpartition(":")
    if not re.fullmatch(r"-?\d+", ax):
        raise DimSpecError(f"--dim {text!r}: axis {ax!r} is not an integer")
    return None, inp, int(ax)

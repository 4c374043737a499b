"""``--dim`` specifications: naming and bounding a model's dynamic dimensions.

Grammar (one ``--dim`` per symbol)::

    NAME=MIN:MAX            bound the dim_param NAME (or an existing symbol NAME)
    NAME=VALUE              fix it to one value
    NAME@PARAM=MIN:MAX      rename the dim_param PARAM to NAME and bound it
    NAME@INPUT:AXIS=MIN:MAX name axis AXIS of graph input INPUT as NAME and bound it
                            (every other occurrence of the same dim_param follows)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from tscomp.errors import DimSpecError

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

    @staticmethod
    def parse(text: str) -> "DimSpec":
        m = _SPEC.match(text.strip())
        if not m:
            raise DimSpecError(
                f"--dim {text!r}: expected NAME=MIN:MAX, NAME=VALUE, NAME@PARAM=MIN:MAX "
                "or NAME@INPUT:AXIS=MIN:MAX")
        lo = int(m["lo"])
        hi = int(m["hi"]) if m["hi"] is not None else lo
        if hi < lo:
            raise DimSpecError(f"--dim {text!r}: range must satisfy 0 <= MIN <= MAX")
        where = m["where"]
        param = inp = axis = None
        if where is not None:
            if ":" in where:
                inp, _, ax = where.rpartition(":")
                if not re.fullmatch(r"-?\d+", ax):
                    raise DimSpecError(f"--dim {text!r}: axis {ax!r} is not an integer")
                axis = int(ax)
            else:
                param = where
        return DimSpec(m["name"], lo, hi, param, inp, axis, text.strip())

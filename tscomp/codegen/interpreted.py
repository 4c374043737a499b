"""The numpy fallback "kernel": a group no macro-kernel family accepts runs through the Plan
interpreter (:func:`tscomp.graph.fusion.interpret.evaluate_group`), i.e. each fused op's registry
reference on numpy arrays.

It is correct by construction (it *is* the reference semantics) but not fast; the compiler lists
every group that ends up here with the reason each family gave, and the manifest records the
group's target as ``"numpy"``, so nobody mistakes it for generated code. Typical users are tiny
opaque groups (Range, CumSum, shape arithmetic) and ops without a C lowering yet (Conv, Resize).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from tscomp.codegen.kernel import KernelBase
from tscomp.graph.fusion.interpret import evaluate_group
from tscomp.graph.fusion.plan import Group, Plan


class InterpretedGroup(KernelBase):
    family = "numpy"
    target = "numpy"

    def __init__(self, plan: Plan, group: Group, reasons: list[str] | None = None):
        self.plan, self.group = plan, group
        self.reasons = list(reasons or [])

    def tasks(self, binding: Mapping[str, int]) -> int:
        return 1

    def run(self, env: Mapping[str, np.ndarray], binding: Mapping[str, int]) -> dict[str, np.ndarray]:
        genv = {name: env[name] for name in self.group.inputs}
        return evaluate_group(self.plan, self.group, genv, dict(binding))


__all__ = ["InterpretedGroup"]

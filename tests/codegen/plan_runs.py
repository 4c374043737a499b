"""Running a tiny model's Plan group by group with the interpreter, so that a compiled
kernel for any group can be checked on exactly the inputs the interpreter gives it."""
from __future__ import annotations

import numpy as np

import tscomp.graph as G
from tscomp.graph.fusion import fuse
from tscomp.graph.fusion.interpret import evaluate_group
from tscomp.graph.reference import bind_symbols, materialize


def model_plan(exported_model, family, exporter, opset=None, *, attention=True):
    """The tiny model's Plan and symbol ranges; ``attention=False`` keeps QKᵀ, softmax and P·V as
    separate groups (for the batched-GEMM family's tests)."""
    from models.families import symbol_ranges
    ranges = symbol_ranges(family)
    path = exported_model(family, "tiny", exporter, opset)
    return fuse(G.load_model(path, [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()]),
                attention=attention), ranges


def kernel_bindings(family, ranges):
    """Sequence 1 and a prime (ViT: one patch and a prime image size)."""
    if family == "vit":
        return [{"batch": 1, "height": ranges["height"][0], "width": ranges["width"][0]},
                {"batch": 2, "height": 37, "width": 61}]
    return [{"batch": 2, "sequence": 1}, {"batch": 3, "sequence": 13}]


def group_env(plan, group, env, binding):
    out = {}
    for name in group.inputs:
        if name not in env:
            env[name] = materialize(plan.graph, plan.graph.values[name], binding)
        out[name] = env[name]
    return out


def interpreted_groups(plan, family, ranges):
    """Yield (binding, group, group inputs, bound symbols, interpreter outputs) for every group
    at every kernel binding, in execution order."""
    from models.families import make_inputs
    rng = np.random.default_rng(0)
    for binding in kernel_bindings(family, ranges):
        inputs = make_inputs(family, binding, rng, size="tiny")
        bound = bind_symbols(plan.graph, inputs)
        env = dict(inputs)
        for g in plan.groups:
            genv = group_env(plan, g, env, bound)
            want = evaluate_group(plan, g, genv, bound)
            yield binding, g, genv, bound, want
            env.update(want)


def compile_gemm_groups(plan, build):
    """``build(plan, group)`` on every gemm group: ({name: kernel}, {name: refusal}); a refusal
    must name its group."""
    from tscomp.errors import UnsupportedOperatorError

    kernels, refused = {}, {}
    for g in plan.groups:
        if g.kind != "gemm":
            continue
        try:
            kernels[g.name] = build(plan, g)
        except UnsupportedOperatorError as exc:
            assert str(exc).startswith(f"group {g.name}: "), str(exc)
            refused[g.name] = str(exc)
    return kernels, refused


def check_against_interpreter(plan, family, ranges, kernels) -> int:
    """Run every compiled group kernel on the interpreter's inputs at each kernel binding and
    compare with the interpreter's outputs; returns how many (group, binding) pairs were checked."""
    checked = 0
    for binding, g, genv, bound, want in interpreted_groups(plan, family, ranges):
        if g.name in kernels:
            got = kernels[g.name].run(genv, bound)
            assert set(got) == set(want)
            for name in want:
                close(got[name], want[name], f"{g.name}:{name} at {binding}")
            checked += 1
    return checked


def close(got, want, what=""):
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)

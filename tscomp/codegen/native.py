"""What every natively compiled kernel object shares: it pickles without its ctypes entry point
(the artifact loader rebinds it from the artifact's library) and without its per-binding caches,
it memoizes its evaluated sizes under one key per binding, and every refusal it raises names the
group (so the runtime's fallback reasons say which group and why)."""
from __future__ import annotations

import contextlib
import hashlib
from typing import Mapping

from tscomp.codegen.kernel import KernelBase

from tscomp.errors import UnsupportedOperatorError


@contextlib.contextmanager
def refusals_name_group(name: str, also: tuple[type[Exception], ...] = ()):
    """Re-raise an :class:`UnsupportedOperatorError` (or one of ``also``) from inside as
    ``group <name>: <why>``, unless it already starts so."""
    try:
        yield
    except UnsupportedOperatorError as exc:
        msg = str(exc)
        if msg.startswith(f"group {name}:"):
            raise
        raise UnsupportedOperatorError(f"group {name}: {msg}") from None
    except also as exc:
        raise UnsupportedOperatorError(f"group {name}: {exc}") from None


def gemm_parts(group):
    """(prologue, heavy, epilogue) ops of a gemm group; refuses other kinds and empty backbones."""
    if group.kind != "gemm":
        raise UnsupportedOperatorError(f"group {group.name}: {group.kind} group is not a GEMM group")
    pro, heavy, epi = group.prologue_epilogue()
    if not heavy:
        raise UnsupportedOperatorError(f"group {group.name}: no heavy op")
    return pro, heavy, epi


def backbone_op(heavy: list):
    """The group's backbone among its heavy ops (:func:`gemm_parts`), else its first heavy op."""
    return next((o for o in heavy if o.fusion.value == "backbone"), heavy[0])


def first_input_integer_range(plan, heavy) -> tuple[int, int] | None:
    """The integers the first input of a group's backbone op (a GEMM's A, a Conv's X) holds, as the
    graph stage recorded them (a quantized activation's float form: ``Value.integer_range``), or
    None: what decides whether the kernel may run on integer instructions."""
    graph = plan.graph
    node = next((n for n in graph.nodes if n.name == heavy.node), None)
    return graph.values[node.inputs[0]].integer_range if node is not None else None


def binding_key(binding: Mapping[str, int]) -> tuple:
    return tuple(sorted(binding.items()))


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def structural_signature(group) -> str:
    """A hash of what a fused group computes, blind to what it is called: the expression DAG of its
    outputs in walk order, each node by kind, op type, attributes, shape and dtype, inputs by first
    appearance (not by name), constants by shape and dtype (not by value). Identical layers of a
    model (BERT's 12 FFN-up groups) share it, so the schedule stage tunes them once."""
    from tscomp.graph.fusion.expr import Const, Input, Op, View, walk

    ids: dict[int, int] = {}
    inputs: dict[str, int] = {}
    parts = []
    for e in walk(list(group.outputs.values())):
        ids[id(e)] = len(ids)
        ref = lambda c: "-" if c is None else str(ids[id(c)])   # noqa: E731
        head = f"{[str(d) for d in e.shape]}:{e.dtype}"
        if isinstance(e, Input):
            parts.append(f"in{inputs.setdefault(e.name, len(inputs))}:{head}")
        elif isinstance(e, Const):
            parts.append(f"const:{head}")
        elif isinstance(e, View):
            parts.append(f"view({e.op.describe()}):{ref(e.src)}:{head}")
        elif isinstance(e, Op):
            attrs = ",".join(f"{k}={v!r}" for k, v in sorted(e.attrs.items()) if not isinstance(v, (bytes,)))
            parts.append(f"{e.op_type}[{attrs}]#{e.output_index}({','.join(ref(c) for c in e.args)}):{head}")
    parts.append("outputs:" + ",".join(ids.get(id(e), "?").__str__() for e in group.outputs.values()))
    return sha256_text("\n".join(parts))[:16]


class PicklableKernel(KernelBase):
    #: attribute -> value it takes in the pickled state (entry points, caches, build-time data)
    TRANSIENT: dict = {"fn": None}

    def __getstate__(self):
        state = dict(self.__dict__)
        for name, empty in self.TRANSIENT.items():
            state[name] = empty() if callable(empty) else empty
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)


__all__ = ["PicklableKernel", "binding_key", "gemm_parts", "refusals_name_group", "sha256_text",
           "structural_signature"]

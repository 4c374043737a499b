"""What every natively compiled kernel object shares: it pickles without its ctypes entry point
(the artifact loader rebinds it from the artifact's library) and without its per-binding caches,
it memoizes its evaluated sizes under one key per binding, and every refusal it raises names the
group (so the runtime's fallback reasons say which group and why)."""
from __future__ import annotations

import contextlib
from typing import Mapping

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


def binding_key(binding: Mapping[str, int]) -> tuple:
    return tuple(sorted(binding.items()))


class PicklableKernel:
    #: attribute -> value it takes in the pickled state (entry points, caches, build-time data)
    TRANSIENT: dict = {"fn": None}

    def __getstate__(self):
        state = dict(self.__dict__)
        for name, empty in self.TRANSIENT.items():
            state[name] = empty() if callable(empty) else empty
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)


__all__ = ["PicklableKernel", "binding_key", "gemm_parts", "refusals_name_group"]

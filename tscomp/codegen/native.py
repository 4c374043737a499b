"""What every natively compiled kernel object shares with the runtime: it pickles without its
ctypes entry point (the artifact loader rebinds it from the artifact's library) and without its
per-binding caches, and it memoizes its evaluated sizes under one key per binding."""
from __future__ import annotations

from typing import Mapping


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


__all__ = ["PicklableKernel", "binding_key"]

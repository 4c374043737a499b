"""Identical kernels compile to one function.

A model's repeated layers (BERT-base's 12 encoder layers) fuse into groups whose generated sources
differ only in their names: the header comment names the group and its ONNX nodes, and the entry
point is named after the group. Compiled one per group, the same machine code sits in the artifact
twelve times: twelve times the compile work, and twelve copies competing for the instruction cache
and L2 on every request (a short request's GEMMs are a few µs each, so fetching cold code is a
visible share of them).

:func:`share_identical_kernels` compares sources with every comment removed (the header, and the
comments inside that name a layer's ONNX nodes: a fused LayerNorm's row pass says which node it
computes) and the entry point's name replaced by a placeholder; every kernel whose canonical
source equals an earlier one's takes that kernel's entry point and source, so codegen compiles it
once and the artifact links it once. Each kernel object keeps its own data (its packed weight, its group's arguments); only the
code is shared. Sources that differ anywhere else (a constant, an epilogue, a tile) are not shared.
A group that shares names the first group's function in the manifest, and that function's source
(``kernels/<func>.c``) has the first group's header: the ONNX nodes of the first layer.
"""
from __future__ import annotations

import hashlib
import re

#: a C string or character literal (kept: a comment marker inside one is text), or a comment
_LITERAL_OR_COMMENT = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|/\*.*?\*/|//[^\n]*', re.S)


def _without_comments(source: str) -> str:
    """``source`` with every comment replaced by one space (as the C preprocessor does)."""
    return _LITERAL_OR_COMMENT.sub(lambda m: m.group(0) if m.group(0)[0] in "\"'" else " ", source)


def canonical_source(source: str, func: str) -> str:
    """``source`` without its comments, its entry point named ``KERNEL``."""
    return re.sub(rf"\b{re.escape(func)}\b", "KERNEL", _without_comments(source))


def share_identical_kernels(kernels) -> int:
    """Point every kernel whose canonical source repeats an earlier kernel's at that kernel's entry
    point and source (in order; kernels without a native function are skipped). Returns how many
    kernels now share another's function."""
    first: dict[str, object] = {}
    shared = 0
    for k in kernels:
        func, source = getattr(k, "func", None), getattr(k, "source", None)
        if not func or not source:
            continue
        key = hashlib.sha256(canonical_source(source, func).encode()).hexdigest()
        owner = first.setdefault(key, k)
        if owner is not k and owner.func != func:
            k.func, k.source = owner.func, owner.source
            shared += 1
    return shared


__all__ = ["canonical_source", "share_identical_kernels"]

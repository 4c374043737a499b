"""User-facing error types.

Every error a user can provoke (bad model file, unknown operator, contradictory
``--dim``, bad run-time input) is a ``TscompError`` whose message is one line
naming the file, node, value or input at fault. The CLI prints that line and
exits non-zero; a traceback is shown only with ``--debug``.
"""


class TscompError(Exception):
    """Base class of all errors meant for the user (one-line message)."""


class ModelLoadError(TscompError):
    """The ONNX file is missing, truncated, corrupt or structurally invalid."""


class UnsupportedOperatorError(TscompError):
    """An operator (or an attribute/variant of one) has no implementation."""


class ShapeError(TscompError):
    """Shapes contradict each other or the operator's semantics."""


class DimSpecError(TscompError):
    """A ``--dim`` specification is malformed or contradicts the model."""


class ExecutionError(TscompError):
    """The reference executor was given inputs it cannot run with."""

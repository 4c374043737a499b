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


class IndexOutOfRangeError(ExecutionError):
    """A data-dependent index (Gather*, an embedding lookup) lies outside its axis: the message
    names the node, the index input, the value, where it is and the valid range ``[-d, d-1]``."""

    def __init__(self, message: str, *, node: str = "", input: str = "", value: int = 0, extent: int = 0):
        super().__init__(message)
        self.node, self.input, self.value, self.extent = node, input, value, extent

    def __reduce__(self):
        return (_index_error, (self.args[0], self.node, self.input, self.value, self.extent))


def _index_error(message, node, input, value, extent):
    return IndexOutOfRangeError(message, node=node, input=input, value=value, extent=extent)

"""Loading and running compiled artifacts (TSCompiler §6)."""
from tscomp.runtime.runtime import Runtime

__all__ = ["Runtime"]

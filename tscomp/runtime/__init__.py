"""Loading and running compiled artifacts (TSCompiler §6)."""
from tscomp.runtime.threads import configure_openmp_wait

#: the kernels' OpenMP wait policy, decided before any kernel library (and libgomp) is loaded
OPENMP_WAIT = configure_openmp_wait()

from tscomp.runtime.runtime import Runtime  # noqa: E402

__all__ = ["OPENMP_WAIT", "Runtime"]

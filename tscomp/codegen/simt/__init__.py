"""SIMT macro-kernels for the CUDA target, written once and rendered as CUDA C and OpenCL C
(DESIGN.md "Dialect"; TSCompiler §5.1, §5.4, §6)."""

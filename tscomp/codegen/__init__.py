"""Code generation: fused groups + tile configurations -> macro-kernel sources, built
with the system C compiler (CPU target). See DESIGN.md "Targets"."""

"""Shape, layout and indexing operators (filled in by the tensor-ops work)."""

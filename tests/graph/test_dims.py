"""--dim specification parsing."""
import pytest

from tscomp.errors import DimSpecError
from tscomp.graph.dims import DimSpec


def test_parse_name_range():
    s = DimSpec.parse("L=1:512")
    assert (s.name, s.min, s.max, s.param, s.input) == ("L", 1, 512, None, None)


def test_parse_single_value_fixes_the_dim():
    s = DimSpec.parse("B=4")
    assert (s.min, s.max) == (4, 4)


def test_parse_rename_of_dim_param_and_of_input_axis():
    assert DimSpec.parse("L@sequence=1:128").param == "sequence"
    s = DimSpec.parse("L@input_ids:1=1:128")
    assert (s.input, s.axis) == ("input_ids", 1)


def test_a_range_may_start_at_zero_for_a_dimension_that_can_be_empty():
    s = DimSpec.parse("past=0:511")      # a KV cache before the first token
    assert (s.min, s.max) == (0, 511)


def test_a_dim_may_be_declared_as_an_expression_of_other_dims():
    s = DimSpec.parse("total=past + sequence")
    assert (s.name, s.expr, s.param) == ("total", "past + sequence", None)
    assert DimSpec.parse("t@attention_mask:1=past+sequence").axis == 1


@pytest.mark.parametrize("text", ["L", "L=-1:4", "L=9:3", "=1:3", "L@x:y=1:2", "L=1:2:3"])
def test_malformed_specs_are_rejected_with_the_spec_quoted(text):
    with pytest.raises(DimSpecError, match="--dim"):
        DimSpec.parse(text)

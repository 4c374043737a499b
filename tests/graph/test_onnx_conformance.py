"""ONNX conformance node cases for every registered operator, and for every operator tscomp
expands from its ONNX function definition (see conformance.py)."""
import pytest

from tests.graph import conformance


def _run_cases(op, record_property):
    cases = conformance.cases_by_op().get(op, [])
    ran, skipped, failures = 0, {}, []
    for case in cases:
        reason = conformance.skip_reason(case)
        if reason:
            skipped[case.name] = reason
            continue
        for mode in conformance.modes(case):
            try:
                conformance.run_case(case, mode)
            except Exception as e:  # collect all failures of the op, report together
                failures.append(f"{case.name} [{mode}]: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        ran += 1
    record_property("conformance_counts", (op, ran, len(skipped)))
    print(f"{op}: {ran} cases ran, {len(skipped)} skipped")
    for name, reason in skipped.items():
        print(f"  skipped {name}: {reason}")
    assert all(skipped.values()), "every skipped case needs a written reason"
    assert not failures, f"{len(failures)} failing cases:\n" + "\n".join(failures)


@pytest.mark.parametrize("op", conformance.registered_ops())
def test_onnx_conformance_cases_pass_for_registered_op(op, record_property):
    _run_cases(op, record_property)


@pytest.mark.parametrize("op", conformance.function_ops())
def test_onnx_conformance_cases_pass_for_an_op_expanded_from_its_function_definition(op, record_property):
    _run_cases(op, record_property)

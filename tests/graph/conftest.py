"""Prints the per-operator ONNX conformance counts at the end of the run (also under xdist:
the counts travel as ``user_properties`` on the test reports)."""

_COUNTS: dict[str, tuple[int, int]] = {}


def pytest_runtest_logreport(report):
    if report.when != "call":
        return
    for key, value in report.user_properties:
        if key == "conformance_counts":
            op, ran, skipped = value
            _COUNTS[op] = (ran, skipped)


def pytest_terminal_summary(terminalreporter):
    if not _COUNTS:
        return
    tr = terminalreporter
    tr.section("ONNX conformance cases per registered operator (ran / skipped with a reason)")
    items = [f"{op} {ran}/{skipped}" for op, (ran, skipped) in sorted(_COUNTS.items())]
    for k in range(0, len(items), 8):
        tr.write_line("  ".join(items[k:k + 8]))
    total_ran = sum(r for r, _ in _COUNTS.values())
    total_skipped = sum(s for _, s in _COUNTS.values())
    tr.write_line(f"{len(_COUNTS)} operators, {total_ran} cases ran, {total_skipped} skipped")

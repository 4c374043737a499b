# Fresh machine: `make demo` or `make test`. Both create/refresh .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-asan venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@# the CUDA target's kernel tests run as OpenCL C on Debian's PoCL (the PyPI PoCL build fails here)
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! dpkg -s pocl-opencl-icd >/dev/null 2>&1; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pocl-opencl-icd ocl-icd-opencl-dev \
		>/dev/null) || echo "warning: could not install pocl-opencl-icd; SIMT kernel tests will skip"; fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[export,test]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -n 2 --durations=15 tests

# The C-kernel and request-path tests with every generated kernel (and the request path's
# extension) built under AddressSanitizer (TSCOMP_SANITIZE is part of the kernel cache key).
# Python is not instrumented, so libasan is preloaded. The SIMT tests are left out: PoCL's LLVM
# JIT aborts the process under the preloaded sanitizer (their race and bounds checking is
# Oclgrind's, in tests/codegen/simt).
test-asan: $(STAMP)
	TSCOMP_SANITIZE=address ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD=$$($${CC:-cc} -print-file-name=libasan.so) \
		$(PY) -m pytest -p no:xdist -q --ignore=tests/codegen/simt tests/codegen tests/runtime/test_native_executor.py tests/runtime/test_request_path.py tests/graph/ops/test_signal_ops.py \
		tests/graph/ops/test_sampling_ops.py

demo: $(STAMP)
	$(VENV)/bin/python -m models.export bert --size tiny --exporter dynamo -o .cache/models
	$(VENV)/bin/tscomp inspect .cache/models/bert-tiny-dynamo.onnx --dim batch=1:8 --dim sequence=1:512 --groups --picture .cache/bert-tiny-plan.png
	$(VENV)/bin/tscomp compile .cache/models/bert-tiny-dynamo.onnx --dim batch=1:8 --dim sequence=1:512 -o .cache/bert-tiny.tsc \
		--budget 8 --records .cache/tuning-records.json
	$(VENV)/bin/tscomp run .cache/bert-tiny.tsc --shape batch=2 --shape sequence=37
	$(VENV)/bin/tscomp bench .cache/bert-tiny.tsc --fix batch=1 --samples 8 --plot .cache/bert-tiny-bench.png

clean:
	rm -rf $(VENV) .cache

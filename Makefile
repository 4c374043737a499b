# Fresh machine: `make demo` or `make test`. Both create/refresh .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[export,test]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -n 2 tests

demo: $(STAMP)
	$(VENV)/bin/python -m models.export bert --size tiny --exporter dynamo -o .cache/models
	$(VENV)/bin/tscomp inspect .cache/models/bert-tiny-dynamo.onnx --dim batch=1:8 --dim sequence=1:512 --groups --picture .cache/bert-tiny-plan.png
	$(VENV)/bin/tscomp compile .cache/models/bert-tiny-dynamo.onnx --dim batch=1:8 --dim sequence=1:512 -o .cache/bert-tiny.tsc
	$(VENV)/bin/tscomp run .cache/bert-tiny.tsc --shape batch=2 --shape sequence=37
	$(VENV)/bin/tscomp bench .cache/bert-tiny.tsc --fix batch=1 --samples 8 --plot .cache/bert-tiny-bench.png

clean:
	rm -rf $(VENV) .cache

# Two entry points for a new user: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run report-full test lint install clean bench tightness

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned to the CPU build on disk; a bare `torch` would pull CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0
	# the build backend pyproject.toml asks for, in the venv: tests build a wheel without isolation
	$(PY) -m pip install -q 'setuptools>=68'
	# a current transformers (>= 5.25) brings Hugging Face's `kernels` beside softcert.kernels:
	# the suite runs in the environment users have (tests/test_packaging.py)
	$(PY) -m pip install -q -e '.[data,test,triton,lightning,dist]' 'transformers>=5.25'
	# auto_LiRPA 0.3 declares torch<1.13: install it without its metadata deps.
	$(PY) -m pip install -q --no-deps auto-lirpa==0.3
	touch $(STAMP)

install: $(STAMP)

# The full report (every certify method, whole corpus) takes more than 10 minutes on 2 cores,
# so `make run` builds the quick report (about 2-4 minutes) and re-checks its certificates.
run: $(STAMP)
	$(VENV)/bin/softcert report --quick --out report
	$(VENV)/bin/softcert check report/results.json

report-full: $(STAMP)
	$(VENV)/bin/softcert report --out report-full
	$(VENV)/bin/softcert check report-full/results.json

# Lint (ruff), the layer contract (import-linter), the whole suite, then the kernel and
# bounds tests once more as a CPU without AVX-512 would run them (another vector width,
# another summation order): tests must hold within the proven rounding error on any CPU.
GENERIC_CPU := ATEN_CPU_CAPABILITY=default NUMBA_CPU_NAME=generic
CPU_SENSITIVE := tests/test_kernels_vertex.py tests/test_kernels_topk.py tests/test_vertex.py \
	tests/test_topk.py tests/test_interval.py tests/test_fp_rows.py tests/test_floating.py \
	tests/test_certificate.py tests/test_kernels_dinkelbach.py tests/test_fp_attention.py tests/test_certify_golden.py

# import-linter reads a package from one folder; ours are mapped under softcert (pyproject.toml
# [tool.setuptools.package-dir]), so the contract is checked on the installed layout, staged.
LINT_PACKAGES := kernels bounds analysis certify
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	stage=$$(mktemp -d) && cp -r softcert $$stage/softcert && \
	  for p in $(LINT_PACKAGES); do cp -r $$p $$stage/softcert/$$p; done && \
	  (cd $$stage && PYTHONPATH=$$stage $(CURDIR)/$(VENV)/bin/lint-imports $(CURDIR)/pyproject.toml); \
	  status=$$?; rm -rf $$stage; exit $$status

test: lint
	$(PY) -m pytest -q -n 2 tests
	cache=$$(mktemp -d) && $(GENERIC_CPU) NUMBA_CACHE_DIR=$$cache $(PY) -m pytest -q -n 2 -p no:cacheprovider $(CPU_SENSITIVE); \
	  status=$$?; rm -rf $$cache; exit $$status

bench: $(STAMP)
	$(VENV)/bin/softcert bench --out docs

clean:
	rm -rf $(VENV) build *.egg-info

tightness: $(STAMP)
	$(VENV)/bin/softcert tightness --out docs

# Serentak: `make run` starts everything on the embedded default; `make test` runs the suite.
# Both set up from nothing: virtualenv, pinned packages, merge_core build, generated code.

SHELL := /bin/bash
PYTHON_BOOT ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
GEN := gen
PROTOS := $(shell find protos -name '*.proto')
MERGE_CORE_SRC := $(shell find merge_core/src merge_core/python -type f 2>/dev/null) merge_core/Cargo.toml merge_core/pyproject.toml
SITE := $(VENV)/lib/python3.11/site-packages

.PHONY: setup run test bench protos lint clean docs

setup: $(VENV)/.installed $(VENV)/.merge_core $(GEN)/.stamp

# The virtualenv with every pinned dependency, and this repo installed editable.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PIP) install -q --upgrade pip==26.3
	$(PIP) install -q -e '.[dev]'
	echo "$(CURDIR)/$(GEN)" > $(SITE)/serentak_gen.pth
	touch $@

# The Rust merge core, built in release mode and installed into the same virtualenv.
$(VENV)/.merge_core: $(VENV)/.installed $(MERGE_CORE_SRC)
	cd merge_core && ../$(VENV)/bin/maturin develop --release -q
	touch $@

# Generated protobuf/gRPC code and typed stubs; never edited by hand. The descriptor set (with
# the protos' comments) is what server reflection serves.
protos: $(GEN)/.stamp
$(GEN)/.stamp: $(VENV)/.installed $(PROTOS)
	rm -rf $(GEN) && mkdir -p $(GEN)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m grpc_tools.protoc -Iprotos \
	  --python_out=$(GEN) --pyi_out=$(GEN) --grpc_python_out=$(GEN) --mypy_grpc_out=$(GEN) \
	  --include_source_info --include_imports \
	  --descriptor_set_out=$(GEN)/serentak/descriptors.binpb $(PROTOS)
	touch $@

run: setup
	$(PY) -m deploy.local.run

test: setup
	bash deploy/local/test.sh

# Every benchmark prints its ratio against a baseline measured in the same run.
# `make bench QUICK=1` runs the small variants.
bench: setup
	@set -e; for b in tests/benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b $(if $(QUICK),--quick); done

# docs/api.md (from the protos' comments) and docs/settings.md (from the settings classes);
# `$(PY) tools/gen_docs.py --check` says whether the committed ones are stale.
docs: setup
	$(PY) tools/gen_docs.py

# Style, types, the architecture's import contracts (pyproject [tool.importlinter]), the
# contracts' lint, and the Rust core's. CI runs it before the tests.
lint: setup
	$(VENV)/bin/ruff check services tests deploy tools merge_core/python
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/buf lint
	cd merge_core && cargo clippy --all-targets -- -D warnings && cargo test -q
	cd merge_core && ../$(PY) -m mypy.stubtest merge_core

clean:
	rm -rf $(GEN) $(VENV) merge_core/target .data

# Serentak: `make run` starts everything on the embedded default; `make test` runs the suite.
# Both set up from nothing: virtualenv, pinned packages, merge_core build, generated code.
# Three distributions: the client `serentak` (client/: contracts, SDK, CLI), the server
# `serentak-server` (this folder, depends on the client) and merge_core.

SHELL := /bin/bash
PYTHON_BOOT ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PROTOS := $(shell find protos -name '*.proto')
# What client/protogen.py writes into the client's source tree (gitignored).
GEN_STAMP := client/serentak/descriptors.binpb
MERGE_CORE_SRC := $(shell find merge_core/src merge_core/python -type f 2>/dev/null) merge_core/Cargo.toml merge_core/pyproject.toml

.PHONY: setup run test bench protos lint clean docs lock

setup: $(VENV)/.installed $(VENV)/.merge_core $(GEN_STAMP)

# The virtualenv with every pinned dependency; the client, then the server, installed
# editable (the server's `serentak==0.1.0` is the editable client). Installing the client
# editable generates its stubs into client/serentak (its setup.py, client/protogen.py).
$(VENV)/.installed: pyproject.toml client/pyproject.toml client/setup.py client/protogen.py
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PIP) install -q --upgrade pip==26.3
	$(PIP) install -q -e ./client
	$(PIP) install -q -e '.[dev]'
	touch $@

# The Rust merge core, built in release mode and installed into the same virtualenv.
$(VENV)/.merge_core: $(VENV)/.installed $(MERGE_CORE_SRC)
	cd merge_core && ../$(VENV)/bin/maturin develop --release -q
	touch $@

# Generated protobuf/gRPC code and typed stubs, by the client's one generator (the same the
# wheel build runs); never edited by hand. The descriptor set (with the protos' comments) is
# what server reflection serves.
protos: $(VENV)/.installed
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) client/protogen.py
$(GEN_STAMP): $(VENV)/.installed $(PROTOS)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) client/protogen.py
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
	$(VENV)/bin/ruff check services tests deploy tools merge_core/python client
	$(VENV)/bin/mypy
	cd client && ../$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/buf lint
	cd merge_core && cargo clippy --all-targets -- -D warnings && cargo test -q
	cd merge_core && ../$(PY) -m mypy.stubtest merge_core

# The hashed locks of the whole dependency tree (pyproject.toml's pins are the top level):
# requirements/server.lock (what the image installs, `pip install --require-hashes`) and
# requirements/dev.lock (+ the dev extra). Rerun after changing a pin;
# tests/deploy/test_locks.py fails while a lock disagrees with pyproject.toml.
LOCK_FLAGS := --universal --python-version 3.11 --generate-hashes --no-emit-package serentak \
	--override requirements/client.override --custom-compile-command "make lock" -q
lock: $(VENV)/.installed
	$(VENV)/bin/uv pip compile pyproject.toml $(LOCK_FLAGS) -o requirements/server.lock
	$(VENV)/bin/uv pip compile pyproject.toml --extra dev $(LOCK_FLAGS) -o requirements/dev.lock

clean:
	rm -rf $(VENV) merge_core/target .data client/build
	cd client/serentak && rm -rf admin events locks notify upload descriptors.binpb

# Cyclone: the developer's verbs. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TOOLS := $(CURDIR)/.tools
BUF := $(TOOLS)/npm/node_modules/.bin/buf
GRPCURL := $(TOOLS)/bin/grpcurl
GEN := pyclient/_gen
PROTOS := $(shell find protos -name '*.proto' | sort)
ADDR ?= 127.0.0.1:50051

export PATH := $(TOOLS)/bin:$(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

.PHONY: venv
venv: $(VENV)/.stamp ## Create .venv with the server, SDK and dev tools

$(BUF):
	mkdir -p $(TOOLS)/npm
	cd $(TOOLS)/npm && npm install --silent --no-audit --no-fund @bufbuild/buf@1

$(GRPCURL):
	GOBIN=$(TOOLS)/bin go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4

.PHONY: tools
tools: $(BUF) $(GRPCURL) ## Install buf (npm) and grpcurl (go install) under .tools/

.PHONY: proto
proto: $(VENV)/.stamp ## Regenerate the Python stubs from protos/
	rm -rf $(GEN) && mkdir -p $(GEN)
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=$(GEN) --pyi_out=$(GEN) \
		--grpc_python_out=$(GEN) $(PROTOS)
	# The descriptor set keeps the proto comments, so reflection (grpcurl describe) shows them.
	$(PY) -m grpc_tools.protoc -Iprotos --include_source_info --include_imports \
		--descriptor_set_out=$(GEN)/cyclone/v1/cyclone.binpb $(PROTOS)
	find $(GEN) -type d -exec touch {}/__init__.py \;

.PHONY: verify
verify: $(VENV)/.stamp $(BUF) ## buf lint, buf breaking against main, stubs up to date
	$(BUF) lint
	@if git rev-parse -q --verify main >/dev/null && git cat-file -e main:buf.yaml 2>/dev/null; then \
		echo "buf breaking against main"; $(BUF) breaking --against '.git#branch=main'; \
	else echo "buf breaking: no protos on main yet"; fi
	$(MAKE) --no-print-directory proto
	git diff --exit-code -- $(GEN) || { echo "stubs differ from protos/: run make proto and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- $(GEN))" || { git status --porcelain -- $(GEN); echo "untracked generated files: run make proto and commit"; exit 1; }

.PHONY: lint
lint: $(VENV)/.stamp ## ruff over hand-written code
	$(VENV)/bin/ruff check service pyclient tests
	$(VENV)/bin/ruff format --check service pyclient tests

.PHONY: fmt
fmt: $(VENV)/.stamp ## Format hand-written code
	$(VENV)/bin/ruff format service pyclient tests
	$(VENV)/bin/ruff check --fix service pyclient tests

.PHONY: run
run: $(VENV)/.stamp ## Serve on $(ADDR); embedded Postgres unless CYCLONE_DATABASE_URL is set
	$(VENV)/bin/cyclone-server --listen $(ADDR)

.PHONY: migrate
migrate: $(VENV)/.stamp ## Apply migrations and exit
	$(VENV)/bin/cyclone-server --migrate-only

.PHONY: test
test: $(VENV)/.stamp tools ## Run the test suite (real Postgres, real servers)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

.PHONY: clean
clean: ## Remove the venv, tools and the embedded database
	rm -rf $(VENV) $(TOOLS) .cyclone

# Cyclone: the developer's verbs. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TOOLS := $(CURDIR)/.tools
BUF := $(TOOLS)/npm/node_modules/.bin/buf
GRPCURL := $(TOOLS)/bin/grpcurl
STATICCHECK := $(TOOLS)/bin/staticcheck
# The Python stubs: the package cyclone.v1 inside the shared core package (core/cyclone).
# Only this directory is generated; the hand-written modules beside it are never wiped.
PY_OUT := core
GEN := $(PY_OUT)/cyclone/v1
# Go and TypeScript code from the same protos: the Go SDK's public package of messages
# and stubs (sdk/go/gen), and the TypeScript SDK's (sdk/ts/src/gen). The protoc plugins
# are pinned by sdk/go/go.mod (tool directives) and sdk/ts/package-lock.json.
GO_SDK := sdk/go
GO_GEN := $(GO_SDK)/gen
GO_MODULE := github.com/cyclone-workflows/cyclone/sdk/go
TS_GEN := sdk/ts/src/gen
PROTOC_GEN_GO := $(TOOLS)/bin/protoc-gen-go
PROTOC_GEN_GO_GRPC := $(TOOLS)/bin/protoc-gen-go-grpc
TS_NPM := sdk/ts/node_modules
PROTOC_GEN_ES := $(CURDIR)/$(TS_NPM)/.bin/protoc-gen-es
GENERATED := $(GEN) $(GO_GEN) $(TS_GEN)
PROTOS := $(shell find protos -name '*.proto' | sort)
# The protos set no go_package: map each file to a Go package under $(GO_GEN), named
# after its proto package (cyclone/v1/x.proto -> $(GO_MODULE)/gen/cyclone/v1, cyclonev1).
GO_PACKAGES := $(foreach p,$(PROTOS:protos/%=%),'M$(p)=$(GO_MODULE)/gen/$(patsubst %/,%,$(dir $(p)));$(subst /,,$(dir $(p)))')
ADDR ?= 127.0.0.1:50051
#: make run serves the web console here, a port beside the gRPC one.
# The console of `make run`: the port after ADDR's (metrics take the one after that).
CONSOLE ?= $(word 1,$(subst :, ,$(ADDR))):$(shell echo $$(( $(lastword $(subst :, ,$(ADDR))) + 1 )))

export PATH := $(TOOLS)/bin:$(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# Serving needs only the server's packages: `make run` installs those (once, saying so);
# the test and lint tools come with the first target that needs them.
$(VENV)/.serve-stamp: pyproject.toml
	@echo "Installing the server's Python packages into $(VENV) (first run only)..."
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -e '.[server,console]' 2>&1 | grep --line-buffered -E '^(Collecting|Installing|Successfully|ERROR)' || true
	@$(PY) -c 'import service.main' || { echo "the server's packages did not install"; exit 1; }
	@touch $@

$(VENV)/.stamp: $(VENV)/.serve-stamp pyproject.toml
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

.PHONY: venv
venv: $(VENV)/.stamp ## Create .venv with the server, SDK and dev tools

$(BUF):
	mkdir -p $(TOOLS)/npm
	cd $(TOOLS)/npm && npm install --silent --no-audit --no-fund @bufbuild/buf@1

$(GRPCURL):
	GOBIN=$(TOOLS)/bin go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4

$(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) &: $(GO_SDK)/go.mod
	cd $(GO_SDK) && GOBIN=$(TOOLS)/bin go install tool

# npm rewrites node_modules/.package-lock.json at every install: it dates the install.
$(TS_NPM)/.package-lock.json: sdk/ts/package-lock.json
	cd sdk/ts && npm ci --silent --no-audit --no-fund

$(STATICCHECK):
	GOBIN=$(TOOLS)/bin go install honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: grpcurl
grpcurl: $(GRPCURL) ## Install only grpcurl, in .tools/bin (needs Go; make tools installs it with the rest)

.PHONY: tools
tools: $(BUF) $(GRPCURL) $(PROTOC_GEN_GO) $(STATICCHECK) $(TS_NPM)/.package-lock.json ## Install buf, grpcurl, staticcheck, the Go and TS protoc plugins

.PHONY: proto
proto: $(VENV)/.stamp $(PROTOC_GEN_GO) $(TS_NPM)/.package-lock.json ## Regenerate the Python, Go and TS code from protos/
	rm -rf $(GEN) && mkdir -p $(GEN)
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=$(PY_OUT) --pyi_out=$(PY_OUT) \
		--grpc_python_out=$(PY_OUT) $(PROTOS)
	# The descriptor set keeps the proto comments, so reflection (grpcurl describe) shows them.
	$(PY) -m grpc_tools.protoc -Iprotos --include_source_info --include_imports \
		--descriptor_set_out=$(GEN)/cyclone.binpb $(PROTOS)
	touch $(GEN)/__init__.py
	rm -rf $(GO_GEN) && mkdir -p $(GO_GEN)
	$(PY) -m grpc_tools.protoc -Iprotos \
		--plugin=protoc-gen-go=$(PROTOC_GEN_GO) --go_out=$(GO_GEN) \
		--go_opt=paths=source_relative $(GO_PACKAGES:%=--go_opt=%) \
		--plugin=protoc-gen-go-grpc=$(PROTOC_GEN_GO_GRPC) --go-grpc_out=$(GO_GEN) \
		--go-grpc_opt=paths=source_relative $(GO_PACKAGES:%=--go-grpc_opt=%) $(PROTOS)
	rm -rf $(TS_GEN) && mkdir -p $(TS_GEN)
	$(PY) -m grpc_tools.protoc -Iprotos --plugin=protoc-gen-es=$(PROTOC_GEN_ES) \
		--es_out=$(TS_GEN) --es_opt=target=ts,import_extension=js $(PROTOS)

.PHONY: verify
#: The contract as last released (a commit of main): buf breaking compares against it, so a
#: clean clone of main checks its own changes too. Move it forward when work lands.
BREAKING_BASELINE ?= 5455be3

verify: $(VENV)/.stamp $(BUF) ## buf lint, buf breaking against the released contract, generated code up to date
	$(BUF) lint
	@git cat-file -e $(BREAKING_BASELINE):buf.yaml 2>/dev/null || \
		{ test "$$(git rev-parse --is-shallow-repository)" = true && git fetch -q --unshallow; } || true
	@git cat-file -e $(BREAKING_BASELINE):buf.yaml 2>/dev/null || { \
		echo "commit $(BREAKING_BASELINE) (BREAKING_BASELINE) is not in this clone: clone with history"; exit 1; }
	@# buf clones this repository shallow (50 commits unless told): ask for enough history to reach the baseline
	@depth=$$(( $$(git rev-list --count $(BREAKING_BASELINE)..HEAD) + 1 )); \
		echo "buf breaking against $(BREAKING_BASELINE) ($$depth commits deep)"; \
		$(BUF) breaking --against ".git#ref=$(BREAKING_BASELINE),depth=$$depth"
	$(MAKE) --no-print-directory proto
	git diff --exit-code -- $(GENERATED) || { echo "generated code differs from protos/: run make proto and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- $(GENERATED))" || { git status --porcelain -- $(GENERATED); echo "untracked generated files: run make proto and commit"; exit 1; }

.PHONY: lint
lint: $(VENV)/.stamp ## ruff over hand-written code, mypy --strict over the server, core/, the SDK and the console
	$(VENV)/bin/ruff check service core pyclient console tests
	$(VENV)/bin/ruff format --check service core pyclient console tests
	$(VENV)/bin/mypy service core pyclient console

.PHONY: fmt
fmt: $(VENV)/.stamp ## Format hand-written code
	$(VENV)/bin/ruff format service core pyclient console tests
	$(VENV)/bin/ruff check --fix service core pyclient console tests

.PHONY: run
# The console is a second process, a client of the server; it goes when the server does.
# The server starts once the console serves (it prints its URL in ready): a console that
# cannot listen ends make run with its one line, and no server starts without it.
run: $(VENV)/.serve-stamp ## Serve on $(ADDR), the console on http://$(CONSOLE)/; embedded Postgres unless CYCLONE_DATABASE_URL is set
	@ready=$$(mktemp); trap 'kill $$console 2>/dev/null; rm -f $$ready' EXIT; \
	$(VENV)/bin/cyclone console --address $(ADDR) --listen $(CONSOLE) --actor console \
		--listen-setting CONSOLE >$$ready & console=$$!; \
	until [[ -s $$ready ]]; do \
		kill -0 $$console 2>/dev/null || { wait $$console; exit; }; sleep 0.1; \
	done; \
	$(VENV)/bin/cyclone-server --listen $(ADDR) --console-url "$$(sed -n 's/.* on //p' $$ready)"

.PHONY: screenshots
screenshots: $(VENV)/.stamp ## Regenerate docs/console/*.png: the console's browser tests, saving pictures
	CYCLONE_SCREENSHOTS=docs/console $(VENV)/bin/pytest tests/test_console.py tests/test_console_buttons.py tests/test_console_lists_browser.py -q -p no:randomly

.PHONY: stop
stop: ## Stop the embedded Postgres under .cyclone/ (make run stops it when it started it)
	@if [[ -x $(VENV)/bin/cyclone-server ]]; then $(VENV)/bin/cyclone-server embedded stop; \
	else echo "no .venv: nothing started here to stop"; fi

.PHONY: migrate
migrate: $(VENV)/.serve-stamp ## Apply migrations and exit
	$(VENV)/bin/cyclone-server --migrate-only

.PHONY: test
# The fast default: what needs only Python (the embedded Postgres comes as a wheel). The
# tests of processes killed and crashed, of the browser and of the Go and TypeScript
# examples are markers (pyproject.toml) that only test-all runs.
FAST_TESTS := not slow and not browser and not polyglot
test: $(VENV)/.stamp ## The fast tests: engine, server, SDK, CLI, console HTML on the embedded Postgres (Python only)
	$(VENV)/bin/pytest -m "$(FAST_TESTS)" $(PYTEST_ARGS)

# test-all and its parts must run everything: a missing tool (grpcurl, Go, Node.js,
# Chromium, PostgreSQL 15, Citus) fails them instead of being skipped.
test-all test-pg15 test-citus: export CYCLONE_TEST_ALL := 1

.PHONY: test-all
test-all: $(VENV)/.stamp tools ## What CI runs: every test, the engine's on PostgreSQL 15 and on Citus, side by side
	tests/together.sh "$(VENV)/bin/pytest --durations=20 $(PYTEST_ARGS)" \
	    "tests/pg15.sh --durations=10 $(PG15_PYTEST_ARGS)" \
	    "tests/citus.sh --durations=10 $(CITUS_PYTEST_ARGS)"

.PHONY: test-pg15
test-pg15: $(VENV)/.stamp tools ## Only the engine's tests, on a throwaway PostgreSQL 15 cluster (PG15_BIN)
	tests/pg15.sh $(PG15_PYTEST_ARGS)

.PHONY: test-citus
test-citus: $(VENV)/.stamp ## Only the Citus suite, on a local coordinator and two workers (after make citus)
	tests/citus.sh $(CITUS_PYTEST_ARGS)

.PHONY: citus
citus: ## Build and install Citus for PostgreSQL 15 from CITUS_SOURCE (a tarball or directory; as root)
	tests/citus/build.sh

.PHONY: bench
BENCH_REPEAT ?= 3
bench: $(VENV)/.stamp ## Benchmarks with a same-run baseline, medians of BENCH_REPEAT (3) runs; writes bench/results/latest.json
	$(PY) bench/bench.py --repeat $(BENCH_REPEAT) $(BENCH_ARGS)

.PHONY: bench-console
bench-console: $(VENV)/.stamp ## The console's pages with 1,000,000 runs: p50/p95, plans, seq scans; writes bench/results/console.json
	$(PY) bench/console_bench.py $(BENCH_ARGS)

.PHONY: bench-tags
bench-tags: $(VENV)/.stamp ## ListRuns/CountRuns by tag with 1,000,000 runs: p50/p95, plans; writes bench/results/tags.json
	$(PY) bench/tags_bench.py $(BENCH_ARGS)

.PHONY: chaos
chaos: $(VENV)/.stamp ## Soak: 2,000 runs (a quarter durable bodies) under kills (CHAOS_ARGS=--seed N), then the long model-based test
	$(PY) bench/chaos.py $(CHAOS_ARGS)
	CYCLONE_MODEL_PROFILE=long $(VENV)/bin/pytest tests/test_model.py -q -p no:randomly

.PHONY: clean
clean: stop ## Stop the embedded Postgres, then remove the venv, tools and the embedded database
	rm -rf $(VENV) $(TOOLS) .cyclone

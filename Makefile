# dsh — run `make help` for the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO        ?= go
BUF       := $(GO) tool -modfile=tools/go.mod buf
GOTEST    ?= $(GO) test
RACE      ?= -race
BENCHTIME ?= 1s
BENCHCOUNT ?= 5
PKGS      := ./...

.PHONY: help
help: ## Show this help.
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

.PHONY: run
run: ## Run the whole stack in one process (embedded NATS + SQLite) and open a chat.
	$(GO) run ./cmd/dsh dev

.PHONY: build
build: ## Build every binary into bin/ (the sandbox launcher static, with its C first stage: it starts on every bash call; needs gcc, kernel headers with linux/landlock.h (>= 5.13) and a static libc (libc.a); `CGO_ENABLED=0 go build ./services/toolhost/cmd/dsh-sandbox-launcher` gives the Go launcher instead).
	$(GO) build -o bin/ ./cmd/... ./services/.../cmd/...
	CGO_ENABLED=1 $(GO) build -ldflags "-s -w" -o bin/ ./services/toolhost/cmd/dsh-sandbox-launcher

.PHONY: generate
generate: ## Regenerate gen/ from proto/ with buf.
	$(BUF) format -w
	$(BUF) generate

.PHONY: descriptors
descriptors: ## Write the descriptor set of every dsh proto (imports and comments included) to dist/dsh.binpb, for dynamic decoders; ship it with releases.
	@mkdir -p dist
	$(BUF) build -o dist/dsh.binpb
	@echo "dist/dsh.binpb: decode DSH_EVENTS payloads as dsh.session.v1.SessionEvent (docs/events.md)"

.PHONY: check
check: lint gen-check fmt-check vet ## Lint protos, check gen/ drift, gofmt and go vet.

.PHONY: lint
lint: ## buf lint and buf format check.
	$(BUF) lint
	@out=$$($(BUF) format -d); if [ -n "$$out" ]; then echo "$$out"; echo "buf format: proto files are not formatted; run 'make generate'"; exit 1; fi

.PHONY: gen-check
gen-check: ## Fail when gen/ differs from what proto/ generates.
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(BUF) generate -o "$$tmp"; \
	if ! diff -r gen "$$tmp/gen" >"$$tmp/diff"; then cat "$$tmp/diff" | head -40; \
	  echo "gen/ is out of date with proto/ (or was edited by hand): run 'make generate' and commit"; exit 1; fi

.PHONY: fmt-check
fmt-check: ## Fail on Go files gofmt would change.
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/') 2>/dev/null || true); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: vet
vet: ## go vet.
	$(GO) vet $(PKGS)

.PHONY: test
test: setup check test-go test-sdk test-readme ## Everything: install what is missing, checks, the Go suite with -race, the SDK suites, the README's commands.
# setup installed postgresql, so the PostgreSQL store's tests must run, not skip.
test: export DSH_REQUIRE_POSTGRES = 1

.PHONY: setup
setup: ## Install what the tests need and is missing (Debian python3-grpcio/protobuf, protoc, postgresql, npm deps).
	scripts/setup-polyglot.sh

.PHONY: test-readme
test-readme: ## Run the README's commands (build, dsh dev -p, the services on their documented ports, grpcurl); alone, after the parallel suite, as its ports are fixed.
	DSH_README_TEST=1 $(GOTEST) -count=1 -timeout 10m ./tests/readme/

.PHONY: test-go
test-go: ## The Go test suite with the race detector.
	$(GOTEST) $(RACE) -count=1 -timeout 15m $(PKGS)

.PHONY: bench
bench: ## Run every Go benchmark (figures go into docs/benchmarks.md).
	$(GOTEST) -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -count $(BENCHCOUNT) $(PKGS)

.PHONY: load
load: ## The load ladder (tests/load): LOAD_TOOL=read|bash LOAD_SESSIONS=10,100,1000 LOAD_DELAY=1s LOAD_JITTER=0 LOAD_RAMP=0 LOAD_WARMUP=0 LOAD_ARGS='extra agent flags' LOAD_ENV='agent=GOGC=200 ...'.
	DSH_LOAD=1 $(GOTEST) -run '^$$' -bench 'Load' -benchtime 1x -count 1 -timeout 60m ./tests/load \
	  -args -load.tool=$(LOAD_TOOL) -load.sessions=$(LOAD_SESSIONS) -load.delay=$(LOAD_DELAY) -load.ramp=$(LOAD_RAMP) -load.warmup=$(LOAD_WARMUP) -load.jitter=$(LOAD_JITTER) -load.agent-args="$(LOAD_ARGS)" -load.env="$(LOAD_ENV)"

LOAD_TOOL     ?= read
LOAD_SESSIONS ?= 10,100,300,1000
LOAD_DELAY    ?= 1s
LOAD_JITTER   ?= 0
LOAD_WARMUP   ?= 0
LOAD_RAMP     ?= 0
LOAD_ARGS     ?=
LOAD_ENV      ?=

.PHONY: fuzz
fuzz: ## Run each fuzz target briefly (FUZZTIME=30s to go longer).
	@for t in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
	  for f in $$(grep -h '^func Fuzz' $$t/*_test.go | sed 's/func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $${FUZZTIME:-10s} $$t || exit 1; done; done

.PHONY: test-sdk
test-sdk: ## The Python and TypeScript SDK suites and their generated-code drift checks (the client examples run in test-go: examples/clients).
	sdk/python/scripts/gen.sh --check
	/usr/bin/python3 -m unittest discover -s sdk/python/tests -t sdk/python
	cd sdk/typescript && npm run --silent generate:check && node --test --test-reporter=spec test/ && npx --no-install tsc -p tsconfig.json

.PHONY: test-polyglot
test-polyglot: setup test-sdk ## Polyglot toolhosts only: SDK suites, conformance suite, MCP bridge.
	$(GOTEST) $(RACE) -count=1 -timeout 10m ./tests/conformance/... ./services/mcpbridge/...

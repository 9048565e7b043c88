# throttlekit: the two commands a newcomer needs are `make demo` and `make test`.
GO ?= go
export PATH := $(PATH):/usr/local/go/bin
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME ?= 10s

.PHONY: test test-short test-unleash lint vet apicheck fuzz demo demo-embedded servers unleash bench bench-peers

# Integration modules: each has its own go.mod (so that a program importing only the core never
# inherits gRPC, OpenTelemetry or Prometheus in its module graph) and replaces the core with the
# checkout it sits in, so each is built, vetted and tested with the core at the same commit.
# `go test ./...` at the root does not descend into them; every target below runs them too.
MODULES := middleware/grpc middleware/rls observe/otel observe/prometheus examples/observability

# Tests run through internal/testprogress: go test's own lines (ok, FAIL, each failing test's output
# in full) as each package ends, and a line naming the packages still running, and for how long,
# whenever 20 s pass without one. It exits with go test's status.
TESTPROGRESS = $(GO) run ./internal/testprogress

## test: lint, then every test under the race detector, with real Redis, memcached and Unleash servers (what CI runs)
test: servers unleash lint
	$(TESTPROGRESS) -label core -list ./... -- $(GO) test -json -race -count=1 -timeout 30m ./...
	@set -e; for m in $(MODULES); do echo "== $$m"; $(TESTPROGRESS) -label $$m -dir $$m -list ./... -- $(GO) test -json -race -count=1 -timeout 30m ./...; done

## test-short: unit tests only, no servers (under two minutes)
test-short:
	$(TESTPROGRESS) -label core -list ./... -- $(GO) test -json -short -race -count=1 ./...
	@set -e; for m in $(MODULES); do echo "== $$m"; $(TESTPROGRESS) -label $$m -dir $$m -list ./... -- $(GO) test -json -short -race -count=1 ./...; done

## test-unleash: the rollout tests alone, the real Unleash server (PostgreSQL 15, unleash-server on Node 20) included
test-unleash: unleash
	$(GO) test -race -count=1 -run 'Unleash' -v ./rollout/... ./internal/localserver/

## lint: gofmt, go vet, staticcheck (pinned) and go mod tidy -diff, for the core, each integration module and bench/
lint: vet
	$(GO) run $(STATICCHECK) ./...
	$(GO) mod tidy -diff
	@set -e; for m in $(MODULES); do echo "== $$m"; (cd $$m && $(GO) run $(STATICCHECK) ./... && $(GO) mod tidy -diff); done
	cd bench && $(GO) vet ./... && $(GO) mod tidy -diff
	./scripts/apicheck.sh

## apicheck: every module's exported API against the last release's (CHANGELOG.md): an incompatible change must be announced there
apicheck:
	./scripts/apicheck.sh

## vet: gofmt check and go vet
vet:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) vet ./...); done

## fuzz: every fuzz target, FUZZTIME each (10s unless told)
fuzz:
	@set -e; for m in . $(MODULES); do \
		for pkg in $$(cd $$m && $(GO) list ./...); do \
			for target in $$(cd $$m && $(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
				echo "fuzz $$pkg $$target"; \
				(cd $$m && $(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) $$pkg); \
			done; \
		done; \
	done

## demo: the migration demo end to end on real memcached and Redis servers; ends with a summary and an HTML report
demo: servers
	$(GO) run ./cmd/migrate-demo

## demo-embedded: the same demo on in-memory backends, for machines without the servers
demo-embedded:
	$(GO) run ./cmd/migrate-demo -embedded

## servers: install redis-server, redis-cli and memcached when missing
servers:
	./scripts/install-servers.sh

## unleash: install PostgreSQL 15 and the pinned unleash-server npm package when missing
unleash:
	./scripts/install-unleash.sh

## bench-peers: throttlekit against ulule/limiter, redis_rate, throttled and x/time/rate on the same servers; writes bench/BENCHMARKS.md with every goal and its figure (about 6 minutes; BENCH_QUICK=1 for a 30 s smoke run)
bench-peers: servers
	cd bench && $(GO) run . -o BENCHMARKS.md

## bench-rls: throttlekit-rls against envoy ratelimit (built from its module at run time) on one Redis; writes bench/RLS.md with every goal and its figure (about 6 minutes on a quiet machine, longer while neighbours hold the CPUs; BENCH_QUICK=1 for a 30 s smoke run)
.PHONY: bench-rls
bench-rls: servers
	cd bench && $(GO) run ./cmd/rls-peers -o RLS.md

## bench: every benchmark, once (compare ratios within one run: the machine is shared)
bench: servers
	$(GO) test -run '^$$' -bench . -benchtime 2s ./...
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) test -run '^$$' -bench . -benchtime 2s ./...); done

# throttlekit: the two commands a newcomer needs are `make demo` and `make test`.
GO ?= go
export PATH := $(PATH):/usr/local/go/bin

.PHONY: test demo demo-embedded servers vet fmt bench

## test: vet, format check, then every test under the race detector (real Redis and memcached)
test: servers vet
	$(GO) test -race -count=1 -timeout 30m ./...

## demo: the migration demo end to end on real memcached and Redis servers
demo: servers
	$(GO) run ./cmd/migrate-demo

## demo-embedded: the same demo on in-memory backends, for machines without the servers
demo-embedded:
	$(GO) run ./cmd/migrate-demo -embedded

## servers: install redis-server, redis-cli and memcached when missing
servers:
	./scripts/install-servers.sh

vet:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

## bench: every benchmark, once (compare ratios within one run: the machine is shared)
bench: servers
	$(GO) test -run '^$$' -bench . -benchtime 2s ./...

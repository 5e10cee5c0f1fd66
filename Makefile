# make test    the tests of README.md: the main module's packages, then the
#              integration tests (caddytest/, a module of its own so that the
#              SDKs they drive are no requirement of a Caddy build)
# make check   gofmt and go vet over every module, then make test (what CI runs)
# make bench   the side-by-side benchmark (bench/README.md, a module of its
#              own): builds the development Caddy and the load driver,
#              measures direct, reverse_proxy and llm_router, prints the table
#              (about 7 minutes on an idle 2-core machine); results in
#              bench/results/
# make demo    the demo of README.md

GO ?= go
BENCH_FLAGS ?=
MODULES = . caddytest bench

.PHONY: bench check demo test

test:
	$(GO) test -race ./...
	cd caddytest && $(GO) test -race ./...

check:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done
	$(MAKE) test

bench:
	$(GO) build -o bench/results/bin/caddy ./cmd/caddy
	cd bench && $(GO) build -o results/bin/llmbench .
	bench/results/bin/llmbench run -caddy bench/results/bin/caddy -out bench/results $(BENCH_FLAGS)

demo:
	$(GO) run ./cmd/caddy run --config Caddyfile.example

# make bench   the side-by-side benchmark of issue 6 (bench/README.md): builds
#              the development Caddy and the load driver, measures direct,
#              reverse_proxy and llm_router, prints the table (about 7 minutes
#              on an idle 2-core machine); results in bench/results/
# make demo    the demo of README.md
# make test    the tests of README.md

GO ?= go
BENCH_FLAGS ?=

.PHONY: bench demo test

bench:
	$(GO) build -o bench/results/bin/caddy ./cmd/caddy
	$(GO) build -o bench/results/bin/llmbench ./bench
	bench/results/bin/llmbench run -caddy bench/results/bin/caddy -out bench/results $(BENCH_FLAGS)

demo:
	go run ./cmd/caddy run --config Caddyfile.example

test:
	go test -race ./...

# make test    the tests of README.md: the main module's packages, then the
#              integration tests (caddytest/, a module of its own so that the
#              SDKs they drive are no requirement of a Caddy build)
# make check   gofmt, go vet and staticcheck (pinned below, run with go run:
#              nothing to install; its settings in staticcheck.conf) over
#              every module, then make test (what CI runs)
# make sim     the deterministic simulation of the routing core
#              (internal/sim, TESTING.md): the real router, queue, capacity,
#              hedging and resume in virtual time (testing/synctest) against
#              simulated providers and clients; every scenario on seeds
#              1..SEEDS (20 by default; about 30 s with -race on 2 cores).
#              SEED=n runs one seed (a replay, with its whole report),
#              SCENARIO=name one scenario. A broken invariant prints the
#              run's trace file and the command that replays it; the
#              scenarios of kinds not fixed yet (knownFailing in
#              internal/sim/scenarios_test.go) are reported, not failed,
#              and fail once they pass. TestSimIsReproducible too: five
#              runs, each three times, must give one trace byte for byte.
#              CI runs it after make check.
# make bench   the side-by-side benchmark (bench/README.md, a module of its
#              own): builds the development Caddy and the load driver,
#              measures direct, reverse_proxy and llm_router, prints the table
#              (about 7 minutes on an idle 2-core machine); results in
#              bench/results/
# make demo    the demo of README.md
# make status-check  the status page in headless Chromium (Debian's chromium):
#              builds the development Caddy, runs the demo (ports 8080,
#              9001-9003, 2019), sends the README's requests, checks the
#              rendered page and saves docs/status.png
#              (scripts/status-check.sh; about 30 s with a warm build cache)
# make cors-check  "Browser clients and CORS" (docs/security.md) in headless Chromium:
#              a page on two other origins fetch()es two routers (one with
#              docs/security.md's CORS block) as text/plain and JSON, and uploads
#              through pass_through; checks what the page read and what each
#              llm_mock provider counted (ports 8480-8487;
#              scripts/cors-check.sh; under a minute)
# make mutate  mutation testing of the core with gremlins (pinned below):
#              router/ and capacity/ must kill at least 90% of the covered
#              mutants (efficacy), adapters/ is reported; results in
#              mutation/ (about 50 minutes on an idle 2-core machine;
#              TESTING.md lists the figures and each surviving mutant)
# make agents  the coding agents as clients: installs Claude Code, Codex
#              CLI and the official Node SDKs (openai, @anthropic-ai/sdk)
#              from npm at the pinned versions below into .agents/, and
#              runs each through the router against llm_mock providers
#              (caddytest/agents_test.go; under a minute after the install)

GO ?= go
BENCH_FLAGS ?=
MODULES = . caddytest bench

AGENTS_DIR ?= $(CURDIR)/.agents
CLAUDE_CODE_VERSION = 2.1.332
CODEX_VERSION = 0.171.0
OPENAI_NODE_VERSION = 7.59.0
ANTHROPIC_NODE_VERSION = 1.15.0
STATICCHECK = honnef.co/go/tools/cmd/staticcheck@v0.8.2
GREMLINS = github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0
MUTATE_FLAGS ?= --workers 2 --timeout-coefficient 10
SEEDS ?= 20
SEED ?= 0
SCENARIO ?=

.PHONY: agents bench check cors-check demo mutate sim status-check test

test:
	@# caddytest runs even when the main module fails; either failing fails the target.
	$(GO) test -race ./...; main=$$?; cd caddytest && $(GO) test -race ./... && exit $$main

check:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done
	cd caddytest && $(GO) vet -tags agents ./...
	for m in $(MODULES); do (cd $$m && $(GO) run $(STATICCHECK) ./...) || exit 1; done
	cd caddytest && $(GO) run $(STATICCHECK) -tags agents ./...
	$(MAKE) test

sim:
	$(GO) test -race -count=1 -v -run '^TestSim$$|^TestSimIsReproducible$$' ./internal/sim/ \
		-args -sim.seeds=$(SEEDS) -sim.seed=$(SEED) -sim.scenario=$(SCENARIO)

bench:
	$(GO) build -o bench/results/bin/caddy ./cmd/caddy
	cd bench && $(GO) build -o results/bin/llmbench .
	bench/results/bin/llmbench run -caddy bench/results/bin/caddy -out bench/results $(BENCH_FLAGS)

demo:
	$(GO) build -o caddy-dev ./cmd/caddy
	./caddy-dev run --config Caddyfile.example

status-check:
	GO=$(GO) bash scripts/status-check.sh

cors-check:
	GO=$(GO) bash scripts/cors-check.sh

mutate:
	mkdir -p mutation
	$(GO) run $(GREMLINS) unleash $(MUTATE_FLAGS) --threshold-efficacy 90 -o mutation/capacity.json ./internal/capacity
	$(GO) run $(GREMLINS) unleash $(MUTATE_FLAGS) --threshold-efficacy 90 -o mutation/router.json ./internal/router
	$(GO) run $(GREMLINS) unleash $(MUTATE_FLAGS) -o mutation/adapters.json ./internal/adapters

agents:
	mkdir -p $(AGENTS_DIR)
	npm install --prefix $(AGENTS_DIR) --no-audit --no-fund --no-save \
		@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) @openai/codex@$(CODEX_VERSION) \
		openai@$(OPENAI_NODE_VERSION) @anthropic-ai/sdk@$(ANTHROPIC_NODE_VERSION)
	cd caddytest && AGENTS_DIR=$(AGENTS_DIR) $(GO) test -tags agents -run 'TestAgents|TestNodeSDKs' -count=1 -v .

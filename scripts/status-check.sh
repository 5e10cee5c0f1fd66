#!/usr/bin/env bash
# The status page in a real browser. Builds the development Caddy, runs the
# demo (Caddyfile.example: the router on :8080, llm_mock providers on
# 9001-9003, admin on localhost:2019; those ports must be free), sends the
# README's quick-start requests (primary answers one, then rate-limits, and
# the router fails over to secondary), renders http://localhost:8080/status/
# in headless Chromium and checks the rendered DOM: both deployments shown,
# primary cooling (circuit open), secondary serving (closed) with tokens
# counted. Saves a screenshot to $STATUS_SCREENSHOT (default
# docs/status.png). Stops everything it started. Exits non-zero, saying
# why, on any failure.
#
#   scripts/status-check.sh        (or: make status-check)
#
# Needs Debian's chromium (apt-get install -y chromium), curl and Go.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
SCREENSHOT=${STATUS_SCREENSHOT:-docs/status.png}
URL=http://localhost:8080/status/
PRIMARY=primary/mock-gpt-small
SECONDARY=secondary/mock-llama-8b

CHECK=status-check PORTS='8080|9001|9002|9003|2019'
. scripts/lib/browser-check.sh

say "building the development Caddy"
"$GO" build -o "$tmp/caddy" ./cmd/caddy

say "starting the demo (Caddyfile.example)"
"$tmp/caddy" run --config Caddyfile.example >"$tmp/caddy.log" 2>&1 &
caddy_pid=$!
for _ in $(seq 100); do
	curl -fsS -o /dev/null "$URL?format=json" 2>/dev/null && break
	kill -0 "$caddy_pid" 2>/dev/null || fail "Caddy exited at start"
	sleep 0.1
done
curl -fsS -o /dev/null "$URL?format=json" || fail "no status JSON at $URL?format=json after 10 s"

# The README's quick start: three streamed requests to the model group fast.
say "sending the README's three requests"
for i in 1 2 3; do
	curl -sS -i http://localhost:8080/v1/chat/completions \
		-H 'Content-Type: application/json' \
		-d '{"model":"fast","stream":true,"messages":[{"role":"user","content":"Say hello."}]}' >"$tmp/answer$i"
	say "  request $i: $(tr -d '\r' <"$tmp/answer$i" | grep -i '^x-llm-router-deployment:' || echo 'no deployment header')"
done
grep -qi "^x-llm-router-deployment: $SECONDARY" "$tmp/answer2" || fail "expected the second request to fail over to $SECONDARY"

# The page, after its script fetched the JSON (primary cools for 10 s after
# its 429: this runs well within them).
chrome() {
	timeout 60 "$CHROMIUM" --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage \
		--no-first-run --user-data-dir="$tmp/profile" --virtual-time-budget=5000 "$@" 2>>"$tmp/chromium.log"
}
say "rendering $URL in headless Chromium"
chrome --dump-dom "$URL" >"$tmp/dom.html" || fail "chromium could not render $URL"
[ -s "$tmp/dom.html" ] || fail "chromium rendered nothing"

grep -q 'id="updated"[^>]*>Updated ' "$tmp/dom.html" ||
	fail "the page's script did not show the JSON (status line: $(grep -o 'id="updated"[^<]*' "$tmp/dom.html" || true))"

# article NAME: the rendered element of deployment NAME.
article() {
	awk -v RS='<article ' -v want="data-deployment=\"$1\"" \
		'index($0, want) == 1 { sub(/<\/article>.*/, ""); print; exit }' "$tmp/dom.html"
}
# value ELEMENT FIELD: the data-value of the data-field FIELD.
value() {
	{ grep -o "data-field=\"$2\" data-value=\"[^\"]*\"" <<<"$1" || true; } | head -n 1 | sed 's/.*data-value="\([^"]*\)"/\1/'
}
# text ELEMENT FIELD: what the data-field FIELD shows.
text() {
	{ grep -o "data-field=\"$2\"[^>]*>[^<]*" <<<"$1" || true; } | head -n 1 | sed 's/.*>//'
}
positive() { awk -v n="$1" 'BEGIN { exit !(n + 0 > 0) }'; }

primary=$(article "$PRIMARY")
secondary=$(article "$SECONDARY")
[ -n "$primary" ] || fail "the page shows no deployment $PRIMARY"
[ -n "$secondary" ] || fail "the page shows no deployment $SECONDARY"

# circuit ELEMENT: the circuit state the element shows (closed, half_open, open).
circuit() {
	{ grep -o 'data-field="circuit" data-state="[a-z_]*"' <<<"$1" || true; } | head -n 1 | sed 's/.*data-state="//; s/"//'
}

state=$(circuit "$primary")
[ "$state" = open ] || fail "expected $PRIMARY cooling (circuit open), the page shows ${state:-nothing}: $(text "$primary" circuit)"
say "  $PRIMARY: $(text "$primary" circuit)"
limit=$(value "$primary" limit_requests)
remaining=$(value "$primary" remaining_requests)
positive "$limit" || fail "expected $PRIMARY's stated request window, got limit '${limit}'"
say "  $PRIMARY: requests $(text "$primary" remaining_requests) / $(text "$primary" limit_requests) left, failovers: rate limited $(text "$primary" failovers.rate_limited)"
[ "$(value "$primary" failovers.rate_limited)" = 1 ] || fail "expected one failover from $PRIMARY for rate_limited"
[ "$remaining" -le "$limit" ] || fail "expected remaining ($remaining) <= limit ($limit)"

state=$(circuit "$secondary")
[ "$state" = closed ] || fail "expected $SECONDARY serving (circuit closed), the page shows ${state:-nothing}"
say "  $SECONDARY: $(text "$secondary" circuit)"
for f in answers input_tokens output_tokens; do
	v=$(value "$secondary" "usage.total.$f")
	positive "$v" || fail "expected $SECONDARY's usage.total.$f above 0, got '${v}'"
	w=$(value "$secondary" "usage.last_hour.$f")
	positive "$w" || fail "expected $SECONDARY's usage.last_hour.$f above 0, got '${w}'"
done
say "  $SECONDARY: last hour $(text "$secondary" usage.last_hour.answers) answers, $(text "$secondary" usage.last_hour.input_tokens) input tokens ($(text "$secondary" usage.last_hour.cached_input_tokens) cached), $(text "$secondary" usage.last_hour.output_tokens) output, $(text "$secondary" usage.last_hour.cost_usd)"
grep -q 'data-group="fast"' "$tmp/dom.html" || fail "the page shows no model group fast"

say "taking the screenshot"
chrome --hide-scrollbars --window-size=1280,1600 --screenshot="$tmp/status.png" "$URL" >/dev/null ||
	fail "chromium could not take the screenshot"
[ -s "$tmp/status.png" ] || fail "chromium wrote no screenshot"
mkdir -p "$(dirname "$SCREENSHOT")"
cp "$tmp/status.png" "$SCREENSHOT"
say "  saved $SCREENSHOT ($(wc -c <"$SCREENSHOT") bytes)"
say "OK"

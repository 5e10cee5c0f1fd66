#!/usr/bin/env bash
# "Browser clients and CORS" (docs/security.md) in a real browser. Builds the
# development Caddy and runs, in one process: two routers, each with an
# llm_mock provider for its model group and a gemini llm_mock as its
# pass_through provider (each counts what reaches it: /llm_mock/stats),
# and a static page on two other origins (other ports). The page's script
# fetch()es a router: chat/completions with Content-Type text/plain (a
# "simple" request: no preflight) and with application/json (preflighted),
# then a pass_through path with a multipart upload as a form sends it (no
# key: simple) and as an SDK does (a Bearer key: preflighted); it writes
# what it could read of each into the page.
#
#   router :8480 (no CORS lines)            providers :8483, :8486
#   router :8484 (documented CORS block for   providers :8485, :8487
#                 http://localhost:8481, taken from docs/security.md as written)
#   page   :8481 (the allowed origin), :8482 (another origin)
#
# Headless Chromium renders the page and the script checks what it read
# and what each provider counted: from another origin nothing reaches a
# provider (the router refuses the simple requests: 415 and pass_through's
# 403; the preflighted ones end at the preflight) and the page reads
# nothing; from the allowed origin, with the documented block, the page reads
# every answer (the 415 and the 403 too) and only the JSON request and the
# keyed upload reach a provider. Stops everything it started. Exits
# non-zero, saying why, on any failure.
#
#   scripts/cors-check.sh        (or: make cors-check)
#
# Needs Debian's chromium (apt-get install -y chromium), curl and Go; the
# ports 8480-8487 must be free.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
ALLOWED=http://localhost:8481
OTHER=http://localhost:8482
PLAIN=http://localhost:8480 # a router without CORS lines
CORS=http://localhost:8484  # a router with the documented CORS block

CHECK=cors-check PORTS='848[0-7]'
. scripts/lib/browser-check.sh

# The documented block (docs/security.md), as written, for the allowed origin.
snippet=$(awk '/^<!-- cors-snippet/ { on = 1; next } on && /^```caddyfile/ { next } on && /^```/ { exit } on { print }' docs/security.md)
[ -n "$snippet" ] || fail "no CORS block after <!-- cors-snippet --> in docs/security.md"
snippet=${snippet//https:\/\/app.example.com/$ALLOWED}

# router PORT PROVIDER_PORT FILES_PORT EXTRA: a router site (EXTRA: lines
# before llm_router), its provider, and its pass_through provider (a
# gemini llm_mock: the router does not serve .../models/x:generateContent).
router() {
	cat <<EOF
http://localhost:$1 {
$4
	llm_router /v1/* {
		pass_through files
		provider mock {
			type openai
			base_url http://localhost:$2/v1
			api_key sk-cors-check
		}
		provider files {
			type gemini
			base_url http://localhost:$3/v1beta
			api_key sk-cors-check
		}
		model fast {
			deployment mock mock-cors
		}
	}
}
http://localhost:$2 {
	llm_mock {
		api_key sk-cors-check
	}
}
http://localhost:$3 {
	llm_mock {
		dialect gemini
		api_key sk-cors-check
	}
}
EOF
}

mkdir -p "$tmp/www"
cat >"$tmp/www/index.html" <<'EOF'
<!doctype html>
<meta charset="utf-8">
<title>cors-check</title>
<pre id="result">pending</pre>
<script>
// ?router=URL: fetch() its chat/completions as text/plain, then as JSON,
// then a pass_through path; each line: the request, then what the page
// could read.
const router = new URLSearchParams(location.search).get("router");
const body = JSON.stringify({ model: "fast", messages: [{ role: "user", content: "Say hello." }] });
async function attempt(name, path, init) {
  try {
    const r = await fetch(router + path, { method: "POST", ...init });
    return name + " read " + r.status + " " + (await r.text()).replace(/\s+/g, " ");
  } catch (e) {
    return name + " blocked " + e.name;
  }
}
// A multipart upload through pass_through, as a form sends it (no key) and
// as an SDK does (its key in Authorization, which needs a preflight).
function upload() {
  const form = new FormData();
  form.append("file", new Blob(["spend the operator's account"]), "prompt.txt");
  return form;
}
(async () => {
  const chat = "/v1/chat/completions", pass = "/v1/models/mock-files:generateContent";
  const lines = [
    await attempt("text/plain", chat, { headers: { "Content-Type": "text/plain" }, body }),
    await attempt("application/json", chat, { headers: { "Content-Type": "application/json" }, body }),
    await attempt("upload", pass, { body: upload() }),
    await attempt("keyed-upload", pass, { headers: { Authorization: "Bearer sk-router" }, body: upload() }),
  ];
  document.getElementById("result").textContent = "done\n" + lines.join("\n");
})();
</script>
EOF

cat >"$tmp/Caddyfile" <<EOF
{
	admin off
	persist_config off
}
$(router 8480 8483 8486 "")
$(router 8484 8485 8487 "$snippet")
http://localhost:8481, http://localhost:8482 {
	root * $tmp/www
	file_server
}
EOF

say "building the development Caddy"
"$GO" build -o "$tmp/caddy" ./cmd/caddy

say "starting two routers, their providers and two pages"
"$tmp/caddy" run --config "$tmp/Caddyfile" --adapter caddyfile >"$tmp/caddy.log" 2>&1 &
caddy_pid=$!
for _ in $(seq 100); do
	curl -fsS -o /dev/null "$OTHER/" 2>/dev/null && curl -fsS -o /dev/null "$PLAIN/v1/models" 2>/dev/null && break
	kill -0 "$caddy_pid" 2>/dev/null || fail "Caddy exited at start"
	sleep 0.1
done
curl -fsS -o /dev/null "$CORS/v1/models" || fail "no router at $CORS after 10 s"

# requests PORT: the API requests the provider on PORT received.
requests() {
	curl -fsS "http://localhost:$1/llm_mock/stats" | sed -n 's/.*"requests":\([0-9]*\).*/\1/p'
}
# visit PAGE ROUTER: what the page at PAGE read from ROUTER (one line per fetch).
visit() {
	timeout 60 "$CHROMIUM" --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage \
		--no-first-run --user-data-dir="$tmp/profile-${1##*:}" --virtual-time-budget=5000 \
		--dump-dom "$1/?router=$2" 2>>"$tmp/chromium.log" >"$tmp/dom.html" || fail "chromium could not render $1"
	awk '/<pre id="result">/ { on = 1; sub(/.*<pre id="result">/, "") } on { print } /<\/pre>/ { exit }' "$tmp/dom.html" |
		sed 's/<\/pre>.*//; s/&quot;/"/g; s/&amp;/\&/g'
}
# expect WHAT READ PATTERN: READ has a line matching PATTERN.
expect() {
	grep -qE "$3" <<<"$2" || fail "$1: expected a line matching /$3/, the page read: $2"
	say "  $1: $(grep -E "$3" <<<"$2" | cut -c1-140)"
}

# counted ROUTER_PROVIDER FILES_PROVIDER WANT_ROUTED WANT_PASSED: what the
# two providers of a router counted.
counted() {
	local n m
	n=$(requests "$1")
	m=$(requests "$2")
	[ "$n" = "$3" ] || fail "expected $3 routed requests at the provider on :$1, it counted ${n:-nothing}"
	[ "$m" = "$4" ] || fail "expected $4 passed-through requests at the provider on :$2, it counted ${m:-nothing}"
	say "  the providers counted $n routed and $m passed-through requests"
}
# visited PAGE ROUTER: the page's lines, once its script finished.
visited() {
	local read
	read=$(visit "$1" "$2")
	grep -q '^done' <<<"$read" || fail "the page's script did not finish: $read"
	echo "$read"
}

say "another origin ($ALLOWED) and a router without CORS lines ($PLAIN)"
read=$(visited "$ALLOWED" "$PLAIN")
for r in text/plain application/json upload keyed-upload; do
	expect "$r" "$read" "^$r blocked TypeError"
done
counted 8483 8486 0 0

say "the allowed origin ($ALLOWED) and the router with the documented CORS block ($CORS)"
read=$(visited "$ALLOWED" "$CORS")
expect "text/plain" "$read" '^text/plain read 415 .*"code":"unsupported_content_type"'
expect "application/json" "$read" '^application/json read 200 .*"content":"Hello from llm_mock\."'
expect "upload" "$read" '^upload read 403 .*"code":"cross_origin_request"'
expect "keyed-upload" "$read" '^keyed-upload read [0-9]{3} '
counted 8485 8487 1 1

say "another origin ($OTHER) and the router with the documented CORS block ($CORS)"
read=$(visited "$OTHER" "$CORS")
for r in text/plain application/json upload keyed-upload; do
	expect "$r" "$read" "^$r blocked TypeError"
done
counted 8485 8487 1 1
say "OK"

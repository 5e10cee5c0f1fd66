# Sourced by the browser checks (status-check.sh, cors-check.sh): say and
# fail in the check's name, the tools every check needs, a refusal when
# one of its ports is taken, and a temporary directory removed at exit
# with the Caddy the check started ($caddy_pid) stopped; on a failure the
# last lines of $tmp/caddy.log and $tmp/chromium.log are printed.
#
#   CHECK=name PORTS='regex of ports' . scripts/lib/browser-check.sh

CHROMIUM=${CHROMIUM:-chromium}

say() { echo "$CHECK: $*"; }
fail() {
	echo "$CHECK: FAIL: $*" >&2
	exit 1
}

command -v "$CHROMIUM" >/dev/null || fail "no $CHROMIUM: install Debian's chromium (apt-get install -y chromium) or set CHROMIUM"
command -v curl >/dev/null || fail "no curl"
if command -v ss >/dev/null; then
	busy=$(ss -Hltn 2>/dev/null | awk '{print $4}' | grep -E ":($PORTS)\$" || true)
	[ -z "$busy" ] || fail "the check's ports are taken: $(echo $busy) (stop what listens there)"
fi

tmp=$(mktemp -d)
caddy_pid=
cleanup() {
	rc=$?
	if [ -n "$caddy_pid" ] && kill -0 "$caddy_pid" 2>/dev/null; then
		kill "$caddy_pid" 2>/dev/null || true
		wait "$caddy_pid" 2>/dev/null || true
	fi
	if [ "$rc" -ne 0 ]; then
		[ -s "$tmp/caddy.log" ] && { echo "--- caddy log (last 20 lines)"; tail -n 20 "$tmp/caddy.log"; } >&2
		[ -s "$tmp/chromium.log" ] && { echo "--- chromium log (last 10 lines)"; tail -n 10 "$tmp/chromium.log"; } >&2
	fi
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

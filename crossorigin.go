package llmrouter

import (
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/llmrouter/caddy-llm-router/internal/api"
)

// What a page on another origin can make a browser send. The router
// spends the operator's provider accounts on whatever reaches it, so a
// request a browser sent for such a page must have passed a CORS
// preflight that the Caddyfile answered (docs/security.md: Browser
// clients and CORS). The JSON endpoints get that from their 415 to anything but JSON
// (api.CheckJSON): a JSON body always needs a preflight. pass_through
// passes other bodies (an SDK's multipart upload to /v1/files), so it
// refuses what a browser sends unasked (passRefusal).
//
// Facts from the Fetch standard (https://fetch.spec.whatwg.org/, "CORS
// protocol" and "CORS-safelisted request-header"): a browser sends a
// cross-origin request without a preflight when its method is GET, HEAD
// or POST and every header the page set is safelisted: Content-Type only
// as text/plain, multipart/form-data or application/x-www-form-urlencoded,
// and none of Authorization, x-api-key and the like. It adds on its own
// only credentials it cached (cookies; Basic, Digest, Negotiate or NTLM
// Authorization), Origin (on every cross-origin request but a GET
// navigation) and, in every current browser, Sec-Fetch-Site.

// passRefusal is the 403 for a pass_through request that a page on
// another origin (crossOrigin) could have sent without a preflight
// (unasked), or for a preflight itself, whose answer is the Caddyfile's to
// give: a provider's own (one that lets its SDK run in a page allows any
// origin) would let any page act on the operator's account. nil for anything else: an
// SDK, curl, a page of the router's own origin, a request the browser
// preflighted.
func passRefusal(r *http.Request) *api.Error {
	origin, cross := crossOrigin(r)
	if !cross {
		return nil
	}
	from := "a page on another origin"
	if origin != "" {
		if len(origin) > 100 {
			origin = origin[:100] + "..."
		}
		from += " (" + strconv.Quote(origin) + ")"
	}
	if r.Method == http.MethodOptions {
		return api.Errorf(http.StatusForbidden, api.CrossOrigin, "",
			"pass_through does not pass a CORS preflight from %s on to the provider: the Caddyfile answers preflights for the origins it allows (docs/security.md: Browser clients and CORS)", from)
	}
	if !unasked(r) {
		return nil
	}
	return api.Errorf(http.StatusForbidden, api.CrossOrigin, "",
		"pass_through refuses a request from %s that the browser sent without a CORS preflight, since it would act on the operator's provider account: "+
			"a browser client sends its key in a header (Authorization: Bearer, x-api-key), which makes the browser ask first, from an origin the Caddyfile allows (docs/security.md: Browser clients and CORS)", from)
}

// crossOrigin reports whether a browser sent r for a page of another
// origin than the router's, and that origin when it said: by
// Sec-Fetch-Site (anything but same-origin, or none for what the user
// typed), else by an Origin that is not the request's own ("null" from a
// sandboxed page or a file), as Go's http.CrossOriginProtection tells
// them, but for every method: a GET through pass_through reads the
// operator's account (GET /v1/files).
func crossOrigin(r *http.Request) (string, bool) {
	origin := r.Header.Get("Origin")
	switch r.Header.Get("Sec-Fetch-Site") {
	case "":
	case "same-origin", "none":
		return origin, false
	default:
		return origin, true
	}
	if origin == "" {
		return "", false // not a browser, or a navigation of an older one (the page cannot read its answer)
	}
	u, err := url.Parse(origin)
	return origin, err != nil || u.Host != r.Host
}

// unasked reports whether a browser may have sent r without a preflight:
// a GET, HEAD or POST whose Content-Type, if any, a form can send (or
// cannot be parsed: a browser may read it as one), without a key header a
// browser never adds on its own (x-api-key, api-key, x-goog-api-key, an
// Authorization other than cached credentials).
func unasked(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodPost:
	default:
		return false
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		switch mt, _, err := mime.ParseMediaType(ct); {
		case err != nil, mt == "text/plain", mt == "multipart/form-data", mt == "application/x-www-form-urlencoded":
		default:
			return false
		}
	}
	for _, k := range []string{"X-Api-Key", "Api-Key", "X-Goog-Api-Key"} {
		if r.Header.Get(k) != "" {
			return false
		}
	}
	scheme, _, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	switch strings.ToLower(scheme) {
	case "", "basic", "digest", "negotiate", "ntlm":
		return true
	}
	return false
}

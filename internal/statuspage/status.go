// Package statuspage holds the status page's assets (assets/index.html,
// status.css, status.js), embedded in the binary, and renders the page
// the root's llm_router_status handler serves: static HTML whose only
// variable, the refresh period, is an attribute the script reads, so that
// the inlined style and script keep one hash each for the page's
// Content-Security-Policy.
package statuspage

import (
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"strconv"
	"strings"
	"time"
)

var (
	//go:embed assets/index.html
	indexHTML string
	//go:embed assets/status.css
	styleCSS string
	//go:embed assets/status.js
	scriptJS string
)

// inline is an asset's text as the page inlines it: on a line of its own
// after its opening tag. It is what the CSP hashes.
func inline(asset string) string { return "\n" + asset }

// page is the page with its style and script inlined; {{REFRESH_MS}} is
// left for Page.
var page = strings.NewReplacer("{{STYLE}}", inline(styleCSS), "{{SCRIPT}}", inline(scriptJS)).Replace(indexHTML)

// Page returns the page's HTML (UTF-8) with refresh as the period, in
// whole milliseconds, at which its script fetches ?format=json again (0:
// never; a button refreshes by hand).
func Page(refresh time.Duration) []byte {
	return []byte(strings.Replace(page, "{{REFRESH_MS}}", strconv.FormatInt(refresh.Milliseconds(), 10), 1))
}

// CSP is the page's Content-Security-Policy: nothing but its own inline
// style and script (by hash: they never change) and fetches of its own
// origin; img-src data: is for the empty favicon, which spares a request.
var CSP = "default-src 'none'; script-src '" + cspHash(inline(scriptJS)) + "'; style-src '" + cspHash(inline(styleCSS)) +
	"'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// cspHash is a Content-Security-Policy source for an inline element's text
// (CSP level 2's hash source: sha256, base64).
func cspHash(text string) string {
	sum := sha256.Sum256([]byte(text))
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}

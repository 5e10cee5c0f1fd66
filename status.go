package llmrouter

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/statuspage"
)

func init() {
	caddy.RegisterModule(StatusPage{})
	httpcaddyfile.RegisterHandlerDirective("llm_router_status", parseStatusCaddyfile)
	// Right after metrics, as Caddy orders its own read-only endpoints:
	// before llm_router, so that no order line or route block is needed.
	httpcaddyfile.RegisterDirectiveOrder("llm_router_status", httpcaddyfile.After, "metrics")
}

// DefaultStatusRefresh is how often the status page reloads its JSON when
// refresh is not set.
const DefaultStatusRefresh = 2 * time.Second

// minStatusRefresh is the shortest refresh period accepted, so that an open
// tab cannot become a load test.
const minStatusRefresh = 250 * time.Millisecond

// StatusPage (http.handlers.llm_router_status) serves a live capacity page
// of every llm_router loaded in this Caddy: each deployment's circuit, the
// windows its provider stated, its declared limits and what was used of
// them in the last minute, in-flight attempts, success rate, latency,
// tokens and cost (last hour and total), failovers by reason, and each
// model group's queue. It answers, on any path under its matcher:
//
//	GET <path>?format=json   the report: GET /llm_router/deployments of the
//	                         admin API plus "generated_at" (RFC 3339)
//	GET <path>               an HTML page that renders that JSON and fetches
//	                         it again every refresh period
//
// HEAD is answered as GET without a body, any other method 405, and any
// other format 400. The page loads nothing from elsewhere (its CSS and
// script, internal/status/assets, are inline, allowed by hash in a strict
// Content-Security-Policy)
// and fetches the JSON relative to its own URL, so any mount path works.
// Neither shows a key, but both show the fleet's names, base URLs (their
// userinfo and query values masked) and traffic: the handler has no
// authentication of its own; put the site's (basic_auth, forward_auth)
// in front of it.
type StatusPage struct {
	// Refresh is how often the page fetches the JSON again, as a duration;
	// 0 turns the refreshing off (the page keeps a button to refresh by
	// hand). At least 250ms otherwise. Default: 2s.
	Refresh *caddy.Duration `json:"refresh,omitempty"`

	page []byte
}

// CaddyModule returns the Caddy module information.
func (StatusPage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.llm_router_status",
		New: func() caddy.Module { return new(StatusPage) },
	}
}

// refresh is the refresh period in effect.
func (s *StatusPage) refresh() time.Duration {
	if s.Refresh == nil {
		return DefaultStatusRefresh
	}
	return time.Duration(*s.Refresh)
}

// Validate implements caddy.Validator.
func (s *StatusPage) Validate() error {
	if r := s.refresh(); r < 0 || (r > 0 && r < minStatusRefresh) {
		return fmt.Errorf("refresh must be 0 (off) or at least %v, got %v", minStatusRefresh, r)
	}
	return nil
}

// Provision implements caddy.Provisioner: it renders the page once.
func (s *StatusPage) Provision(caddy.Context) error {
	if err := s.Validate(); err != nil {
		return err
	}
	s.page = statuspage.Page(s.refresh())
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler. It answers every
// request itself: next is never called.
func (s *StatusPage) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	hdr := w.Header()
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		return caddyhttp.Error(http.StatusMethodNotAllowed, fmt.Errorf("llm_router_status: method %s not allowed: use GET", r.Method))
	}
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	var body []byte
	switch format := r.URL.Query().Get("format"); format {
	case "json":
		now := time.Now()
		out := struct {
			GeneratedAt time.Time `json:"generated_at"`
			report
		}{now, statusReport(now)}
		var buf bytes.Buffer
		enc := jsonbody.NewEncoder(&buf) // no \u003e for a > in a message
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return caddyhttp.Error(http.StatusInternalServerError, err)
		}
		body = buf.Bytes() // with Encode's newline
		hdr.Set("Content-Type", "application/json")
		hdr.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
	case "", "html":
		body = s.page
		hdr.Set("Content-Type", "text/html; charset=utf-8")
		hdr.Set("Content-Security-Policy", statuspage.CSP)
	default:
		return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("llm_router_status: unknown format %q: json, or none for the page", format))
	}
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	_, err := w.Write(body)
	return err
}

func parseStatusCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	s := new(StatusPage)
	err := s.UnmarshalCaddyfile(h.Dispenser)
	return s, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	llm_router_status [<matcher>] [{
//	    refresh <duration>    # 0: off; default 2s
//	}]
//
// An argument after the matcher, an unknown or duplicate subdirective, a
// refresh that is not one duration, negative, or shorter than 250ms (but
// 0) are errors, with the file and line.
func (s *StatusPage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	check := once("")
	for d.NextBlock(0) {
		key := d.Val()
		if err := check(d); err != nil {
			return err
		}
		switch key {
		case "refresh":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil {
				return d.Errf("refresh: %v", err)
			}
			if d.NextArg() {
				return d.ArgErr()
			}
			cd := caddy.Duration(dur)
			s.Refresh = &cd
			if err := s.Validate(); err != nil {
				return d.Err(err.Error())
			}
		default:
			return d.Errf("unknown subdirective %s (llm_router_status takes refresh)", key)
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*StatusPage)(nil)
	_ caddy.Validator             = (*StatusPage)(nil)
	_ caddyhttp.MiddlewareHandler = (*StatusPage)(nil)
	_ caddyfile.Unmarshaler       = (*StatusPage)(nil)
)

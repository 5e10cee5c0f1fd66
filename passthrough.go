package llmrouter

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/api"
	"github.com/llmrouter/caddy-llm-router/internal/redact"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// clientCredentials are the client's request headers that never go
// upstream on a pass_through: the browser's and a proxy's credentials and
// every registered provider type's key header (provider.KeyHeader: a
// client's key for one API is not passed on to another); the provider's
// own key goes in its type's.
func clientCredentials() []string {
	names := []string{"Authorization", "Cookie", "Proxy-Authorization"}
	typesWith(func(m caddy.Module) bool {
		if kh, ok := m.(provider.KeyHeader); ok {
			if name, _ := kh.KeyHeader(); !slices.Contains(names, http.CanonicalHeaderKey(name)) {
				names = append(names, http.CanonicalHeaderKey(name))
			}
		}
		return false
	})
	return names
}

// provisionPassThrough builds the proxy of Handler.PassThrough: the
// endpoints the router does not serve (audio, images, files, batches...)
// go to that provider as they came, with its key in place of the client's,
// through its transport; streamed answers are flushed as they come.
func (h *Handler) provisionPassThrough() error {
	name := h.PassThrough
	if name == "" {
		return nil
	}
	p, ok := h.providers[name]
	if !ok {
		return fmt.Errorf("pass_through: unknown provider %s (configured: %s)", name, strings.Join(sortedKeys(h.ProvidersRaw), ", "))
	}
	kh, ok := p.(provider.KeyHeader)
	if !ok {
		keyed := typesWith(func(m caddy.Module) bool { _, ok := m.(provider.KeyHeader); return ok })
		return fmt.Errorf("pass_through: provider %s is of type %s, which states no key header (provider.KeyHeader): "+
			"pass_through cannot put the provider's key in what it passes on (types that state one: %s)", name, h.types[name], strings.Join(keyed, ", "))
	}
	keyName, keyPrefix := kh.KeyHeader()
	credentials := clientCredentials()
	cfg := p.ProviderSettings()
	ep := cfg.endpoint
	secrets, deadline := cfg.secrets(), durationOr(h.Deadline, router.DefaultDeadline)
	base, err := url.Parse(ep.BaseURL)
	if err != nil {
		return fmt.Errorf("pass_through: %v", err)
	}
	basePath := strings.TrimSuffix(base.Path, "/")
	h.passProxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			out := *base
			out.Path = passPath(basePath, pr.In.URL.Path)
			out.RawPath = ""
			q := base.Query()
			for k, vs := range pr.In.URL.Query() {
				if clientQueryCredentials[strings.ToLower(k)] {
					continue // the provider's key goes in its header
				}
				for _, v := range vs {
					q.Add(k, v)
				}
			}
			out.RawQuery = q.Encode()
			pr.Out.URL = &out
			pr.Out.Host = base.Host
			for _, k := range credentials {
				pr.Out.Header.Del(k)
			}
			// An error is read to be redacted (redactPassError): it may
			// come gzip-encoded, or decoded by the transport, not otherwise.
			if acceptsGzip(pr.In.Header) {
				pr.Out.Header.Set("Accept-Encoding", "gzip")
			} else {
				pr.Out.Header.Del("Accept-Encoding")
			}
			for k, vs := range ep.Header {
				pr.Out.Header[k] = vs
			}
			if ep.APIKey != "" {
				pr.Out.Header.Set(keyName, keyPrefix+ep.APIKey)
			}
		},
		Transport:     headerDeadline{rt: cfg.transport, d: deadline},
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del("Server") // Caddy sends its own
			for _, vs := range resp.Header {
				for i, v := range vs {
					vs[i] = redact.String(v, secrets) // a redirect's Location, an echo
				}
			}
			switch {
			case resp.StatusCode == http.StatusSwitchingProtocols:
				return nil // the proxy needs the connection itself (a WebSocket)
			case resp.StatusCode < 400:
				return redactPassAnswer(resp, secrets)
			}
			return redactPassError(resp, secrets, deadline)
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			h.logger.Debug("pass_through: the provider could not be reached", zap.String("provider", name), zap.String("error", redact.String(err.Error(), secrets)))
			// One attempt, no failover: the client's own retry is the only
			// one (no x-should-retry), but not after a whole deadline.
			e := api.Errorf(http.StatusBadGateway, api.Unavailable, "", "pass_through: provider %s could not be reached", name)
			e.Retryable = true
			switch {
			case errors.Is(err, errHeaderDeadline):
				e = api.Errorf(http.StatusGatewayTimeout, api.Deadline, "", "pass_through: provider %s did not answer within the deadline", name)
			case errors.Is(err, errUnreadableError):
				e = api.Errorf(http.StatusBadGateway, api.Unavailable, "", "pass_through: provider %s answered %v: not passed on, since it cannot be redacted", name, err)
			}
			if r.Header.Get("Anthropic-Version") != "" {
				api.Messages{}.WriteError(w, e)
				return
			}
			api.Chat{}.WriteError(w, e)
		},
	}
	return nil
}

// clientQueryCredentials are query parameters that carry a client's key
// (Gemini clients send ?key=): never passed on.
var clientQueryCredentials = map[string]bool{"key": true, "api_key": true, "api-key": true, "access_token": true}

// maxPassError bounds the body of a pass_through provider's error, read
// whole to be redacted: 64 KiB decoded, as the router reads a routed
// error's (enough for any provider's JSON error); past it, the body is
// cut.
const maxPassError = 64 << 10

// errUnreadableError is a pass_through provider's body (an error's or an
// answer's) that the router cannot read, so cannot redact: in an encoding
// other than gzip, or (an error's) not gzip as it says.
var errUnreadableError = errors.New("in an encoding the router cannot read")

// redactPassAnswer removes the provider's secrets from a pass_through
// answer under 400 (a download, a stream) as it flows (redact.Reader:
// whole, URL-encoded or base64 keys of 8 characters or more): unencoded,
// it keeps its length; gzip-encoded, it is decoded as it flows and sent
// unencoded; in another encoding (not asked for), it is
// errUnreadableError.
func redactPassAnswer(resp *http.Response, secrets []string) error {
	body := resp.Body
	switch enc := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		resp.Body = readCloser{redact.Reader(body, secrets), body}
	case "gzip", "x-gzip":
		resp.Body = readCloser{redact.Reader(&lazyGzip{r: body}, secrets), body}
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
		resp.Header.Del("Content-Encoding")
	default:
		body.Close()
		return fmt.Errorf("an answer %w (%s)", errUnreadableError, enc)
	}
	return nil
}

// readCloser reads from one reader and closes another.
type readCloser struct {
	io.Reader
	io.Closer
}

// lazyGzip decodes r from its first read, so that an answer whose
// first bytes are slow to come does not hold ModifyResponse.
type lazyGzip struct {
	r  io.Reader
	zr *gzip.Reader
}

func (z *lazyGzip) Read(p []byte) (int, error) {
	if z.zr == nil {
		zr, err := gzip.NewReader(z.r)
		if err != nil {
			return 0, err
		}
		z.zr = zr
	}
	return z.zr.Read(p)
}

// redactPassError removes the provider's secrets (whole or masked, see
// package redact) from a pass_through answer of status 400 or more,
// which providers' errors echo keys in: its body is read whole (at most
// maxPassError, within d, gzip decoded), redacted and sent unencoded.
func redactPassError(resp *http.Response, secrets []string, d time.Duration) error {
	body := resp.Body
	defer body.Close()
	cut := time.AfterFunc(d, func() { body.Close() }) // a trickled body
	defer cut.Stop()
	var r io.Reader = io.LimitReader(body, maxPassError)
	switch enc := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			return fmt.Errorf("an error %w: %v", errUnreadableError, err)
		}
		r = io.LimitReader(zr, maxPassError) // a gzip bomb
	default:
		return fmt.Errorf("an error %w (%s)", errUnreadableError, enc)
	}
	raw, _ := io.ReadAll(r) // what came before a cut, or the bound
	out := redact.JSON(raw, secrets)
	resp.Body = io.NopCloser(bytes.NewReader(out))
	resp.ContentLength = int64(len(out))
	resp.Header.Set("Content-Length", strconv.Itoa(len(out)))
	resp.Header.Del("Content-Encoding")
	return nil
}

// acceptsGzip reports whether a request's Accept-Encoding takes gzip
// (not with q=0).
func acceptsGzip(h http.Header) bool {
	for _, v := range h.Values("Accept-Encoding") {
		for _, part := range strings.Split(v, ",") {
			name, params, _ := strings.Cut(part, ";")
			if n := strings.ToLower(strings.TrimSpace(name)); n != "gzip" && n != "x-gzip" {
				continue
			}
			if q, ok := strings.CutPrefix(strings.ReplaceAll(params, " ", ""), "q="); !ok || strings.Trim(q, "0.") != "" {
				return true
			}
		}
	}
	return false
}

// passPath maps the client's path to the provider's: the part after the
// client's API root, found by the base path's last segment, under the
// base path (/v1/audio/speech to /api/v1/audio/speech for a base_url
// ending in /api/v1; /v1beta/files to /v1beta/files for one ending in
// /v1beta); a path without that segment goes under the base path whole.
func passPath(basePath, path string) string {
	if last := basePath[strings.LastIndexByte(basePath, '/')+1:]; last != "" {
		seg := "/" + last
		for i := 0; i < len(path); {
			j := strings.Index(path[i:], seg)
			if j < 0 {
				break
			}
			end := i + j + len(seg)
			if end == len(path) || path[end] == '/' {
				return basePath + path[end:]
			}
			i = end
		}
	}
	return basePath + path
}

// errHeaderDeadline is a pass_through provider that sent no response
// headers within the deadline.
var errHeaderDeadline = errors.New("no response headers within the deadline")

// headerDeadline bounds a pass_through exchange until its response
// headers (the router's deadline); the body, once it flows (a long
// download, a stream), is not cut.
type headerDeadline struct {
	rt http.RoundTripper
	d  time.Duration
}

func (h headerDeadline) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	fired := make(chan struct{})
	t := time.AfterFunc(h.d, func() { close(fired); cancel() })
	resp, err := h.rt.RoundTrip(req.WithContext(ctx))
	if !t.Stop() {
		<-fired
		if err == nil {
			resp.Body.Close()
		}
		cancel()
		return nil, errHeaderDeadline
	}
	if err != nil {
		cancel()
		return nil, err
	}
	if conn, ok := resp.Body.(io.ReadWriteCloser); ok {
		resp.Body = cancelOnCloseConn{conn, cancel} // a 101's: the proxy writes to it
		return resp, nil
	}
	resp.Body = cancelOnClose{resp.Body, cancel}
	return resp, nil
}

// cancelOnCloseConn is cancelOnClose for an upgraded connection.
type cancelOnCloseConn struct {
	io.ReadWriteCloser
	cancel context.CancelFunc
}

func (c cancelOnCloseConn) Close() error {
	err := c.ReadWriteCloser.Close()
	c.cancel()
	return err
}

// cancelOnClose ends a pass_through exchange's context with its body.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

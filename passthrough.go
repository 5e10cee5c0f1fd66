package llmrouter

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/api"
)

// passKeyHeaders gives each built-in provider type's key header and its
// value's prefix, for pass_through.
var passKeyHeaders = map[string][2]string{
	"openai":    {"Authorization", "Bearer "},
	"azure":     {"Api-Key", ""},
	"anthropic": {"X-Api-Key", ""},
	"gemini":    {"X-Goog-Api-Key", ""},
}

// clientCredentials are the client's request headers that never go
// upstream on a pass_through: the provider's own key replaces them.
var clientCredentials = []string{"Authorization", "X-Api-Key", "Api-Key", "X-Goog-Api-Key", "Cookie", "Proxy-Authorization"}

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
	key, ok := passKeyHeaders[h.types[name]]
	if !ok {
		return fmt.Errorf("pass_through: provider %s is of type %s, which pass_through cannot reach (openai, azure, anthropic, gemini)", name, h.types[name])
	}
	cfg := p.ProviderSettings()
	ep := cfg.endpoint
	base, err := url.Parse(ep.BaseURL)
	if err != nil {
		return fmt.Errorf("pass_through: %v", err)
	}
	basePath := strings.TrimSuffix(base.Path, "/")
	h.passProxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// The client's path under the provider's API root: /v1/audio/speech
			// to https://api.openai.com/v1/audio/speech.
			path := pr.In.URL.Path
			if basePath != "" && strings.HasPrefix(path, basePath+"/") {
				path = path[len(basePath):]
			}
			out := *base
			out.Path = basePath + path
			out.RawPath = ""
			q := base.Query()
			for k, vs := range pr.In.URL.Query() {
				for _, v := range vs {
					q.Add(k, v)
				}
			}
			out.RawQuery = q.Encode()
			pr.Out.URL = &out
			pr.Out.Host = base.Host
			for _, k := range clientCredentials {
				pr.Out.Header.Del(k)
			}
			for k, vs := range ep.Header {
				pr.Out.Header[k] = vs
			}
			if ep.APIKey != "" {
				pr.Out.Header.Set(key[0], key[1]+ep.APIKey)
			}
		},
		Transport:     cfg.transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			h.logger.Debug("pass_through: the provider could not be reached", zap.String("provider", name), zap.Error(err))
			api.Chat{}.WriteError(w, api.Errorf(http.StatusBadGateway, api.Unavailable, "",
				"pass_through: provider %s could not be reached", name))
		},
	}
	return nil
}

package llmrouter

import (
	"strings"
	"testing"
)

// A base_url refused at load (an endpoint, a query where the type takes
// none, no scheme) is quoted with its userinfo and query values masked:
// the error goes to Caddy's log and to whoever POSTed the config to
// /load, and the credentials in it are the operator's.
func TestRefusedBaseURLShowsNoCredentials(t *testing.T) {
	for _, base := range []string{
		"https://router:sk-proj-UserInfoSecret0123456789@gw.example/v1/chat/completions",
		"https://gw.example/v1?api-key=Zq8xWv2PquerySecret&x=1",
		"https://gw.example/v1/chat/completions?key=Zq8xWv2PquerySecret",
		"gw.example/v1?api-key=Zq8xWv2PquerySecret",
		"https://router:sk-proj-UserInfoSecret0123456789@gw example/v1",
	} {
		h := handlerFromJSON(t, `{"providers":{"p":{"type":"openai","base_url":"`+base+`","api_key":"none"}},
			"models":{"m":{"deployments":[{"provider":"p","model":"x"}]}}}`)
		err := h.Provision(newCaddyContext(t))
		if err == nil {
			t.Errorf("%s: expected a refusal", base)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, "UserInfoSecret") || strings.Contains(msg, "querySecret") ||
			!strings.Contains(msg, "xxxxx") && !strings.Contains(msg, "(not a URL)") {
			t.Errorf("%s: expected the credentials masked, got %s", base, msg)
		}
	}
}

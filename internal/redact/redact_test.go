package redact

import (
	"strings"
	"testing"
)

// A deployment's secret of 8 characters is removed from a body passed
// on, even when nothing about it looks like a key.
func TestShortSecretIsRedacted(t *testing.T) {
	got := string(JSON([]byte(`{"error":{"message":"credential Zq8xWv2P refused"}}`), []string{"Zq8xWv2P", "Zq8xW"}))
	if got != `{"error":{"message":"credential [redacted] refused"}}` {
		t.Errorf("expected the 8-character secret redacted, got %s", got)
	}
}

// Google's OAuth access tokens (Vertex AI's) and JWTs (a service
// account's signed assertion) are secrets whatever words surround them.
func TestCloudTokensAreRedacted(t *testing.T) {
	for _, msg := range []string{
		"Request had invalid authentication credentials ya29.a0AfB_byC1234567890abcdefXYZ",
		"auth: cannot fetch token: 400 assertion=eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJyb3V0ZXJAeCJ9.c2lnbmF0dXJlLXNpZ25hdHVyZQ",
	} {
		if got := String(msg, nil); strings.Contains(got, "ya29.a0") || strings.Contains(got, "eyJpc3M") || !strings.Contains(got, Placeholder) {
			t.Errorf("%q became %q", msg, got)
		}
	}
}

// Redaction keeps what is not a key: model names, organizations, words,
// trace and request IDs, markdown, regions, locales.
func TestRedactionKeepsUsefulText(t *testing.T) {
	for _, msg := range []string{
		"The model pplx-70b-online has been deprecated",
		"The model hf-internal-testing/tiny-random-gpt2 does not exist",
		"Model xai-org/grok-1 is not served here",
		"Missing bearer token in the Authorization header",
		"trace 4bf92f3577b34da6a3ce929d0e0e4736: upstream failed",
		"Unsupported value: ***bold*** markdown in name",
		"request req_0123456789abcdef0123456789abcdef failed",
		"model gpt-4o-mini, desk-top, task-force, sk-learn",
		"Invalid region ASIAPACIFIC2 for deployment",
		"Unknown locale sk-SK. Supported: en-US",
	} {
		if got := String(msg, nil); got != msg {
			t.Errorf("%q became %q", msg, got)
		}
	}
}

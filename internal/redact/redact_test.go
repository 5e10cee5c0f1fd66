package redact

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"os"
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

// A configured secret is redacted whatever its length: one of 8
// characters or more wherever it appears, a shorter one where it stands
// as a token, so that the words that hold it stay.
func TestConfiguredSecretOfAnyLength(t *testing.T) {
	for _, tc := range []struct{ secret, msg, want string }{
		{"x7Q2p", `{"error":{"message":"Invalid API key: x7Q2p","type":"invalid_request_error"}}`,
			`{"error":{"message":"Invalid API key: [redacted]","type":"invalid_request_error"}}`},
		{"abc", "Incorrect API key provided: abc. You can find your API key at the dashboard.",
			"Incorrect API key provided: [redacted]. You can find your API key at the dashboard."},
		{"ab", "key 'ab' refused; a table of abbreviations stays", "key '[redacted]' refused; a table of abbreviations stays"},
		{"k", "key=k&x=1 for kk and key-k", "key=[redacted]&x=1 for kk and key-k"},
		{"Zq8xWv2P", "credentialZq8xWv2Prefused", "credential[redacted]refused"},
	} {
		if got := String(tc.msg, []string{tc.secret}); got != tc.want {
			t.Errorf("secret %q: expected %q, got %q", tc.secret, tc.want, got)
		}
	}
}

// Every masked shape of a key that providers put in their errors is
// redacted, whether the key is configured (the router knows its own) or
// not (a key shape, or a mask named a key).
func TestMaskedShapes(t *testing.T) {
	const key = "sk-proj-Q3vLd82mNcX0aTfXYZ"
	for _, tc := range []struct{ source, msg, want string }{
		{"OpenAI, first 5 and last 4 around stars (openai-python users' reports, e.g. popjane/free_chatgpt_api#3)",
			"Incorrect API key provided: sk-proj-Q***************fXYZ. You can find",
			"Incorrect API key provided: [redacted]. You can find"},
		{"OpenAI-compatible gateway, first 6 and last 4 joined by ASCII dots (issue 26's trial)",
			"Incorrect API key provided: sk-pro...fXYZ.", "Incorrect API key provided: [redacted]."},
		{"the same joined by an ellipsis", "API key sk-pro…fXYZ is invalid", "API key [redacted] is invalid"},
		{"bullets", "key sk-pr••••fXYZ revoked", "key [redacted] revoked"},
		{"DeepSeek, stars before the last 4 (continuedev/continue#11820)",
			"Authentication Fails, Your api key: ****fXYZ is invalid", "Authentication Fails, Your api key: [redacted] is invalid"},
		{"a prefix and stars", "credential sk-proj-Q3v**** refused", "credential [redacted] refused"},
		{"stars before the last 4, no key word", `"detail": "****fXYZ expired"`, `"detail": "[redacted] expired"`},
		{"ordinary dots and stars stay", "Loading... done; ***bold*** text", "Loading... done; ***bold*** text"},
	} {
		if got := String(tc.msg, []string{key}); got != tc.want {
			t.Errorf("%s: expected %q, got %q", tc.source, tc.want, got)
		}
	}
	// Not configured: a key's shape, or a mask named a key.
	for _, tc := range []struct{ source, msg, want string }{
		{"issue 26's trial", "Incorrect API key provided: sk-pro...fXYZ.", "Incorrect API key provided: [redacted]."},
		{"DeepSeek (continuedev/continue#11820)", "Authentication Fails, Your api key: ****fcc2 is invalid",
			"Authentication Fails, Your api key: [redacted] is invalid"},
		{"DeepSeek, a base64 key's end (qingshungLI/Super-nof1.ai#9)", "Authentication Fails, Your api key: ****Njk= is invalid",
			"Authentication Fails, Your api key: [redacted] is invalid"},
		{"OpenAI, a key without sk- (yihong0618/bilingual_book_maker#195)",
			"Incorrect API key provided: D57rV0ys************************************Pp9p. You can",
			"Incorrect API key provided: [redacted]. You can"},
	} {
		if got := String(tc.msg, nil); got != tc.want {
			t.Errorf("%s, not configured: expected %q, got %q", tc.source, tc.want, got)
		}
	}
}

// A mask beside a word that ends with a key's first characters, or
// starts with its last, shows nothing of the key: the text stays.
func TestMasksBesideWordsStay(t *testing.T) {
	for _, tc := range []struct{ key, msg string }{
		{"ead4c0ffee0123456789", "Thread... reading the docs"},
		{"0123456789abcdefmark", "see ***bookmarks*** and ....markdown"},
	} {
		if got := String(tc.msg, []string{tc.key}); got != tc.msg {
			t.Errorf("key %s: %q became %q", tc.key, tc.msg, got)
		}
	}
}

// OpenAI's 401 for a wrong key (the fixture, byte-identical) keeps no
// part of the key it shows.
func TestOpenAIInvalidKeyFixture(t *testing.T) {
	raw, err := os.ReadFile("testdata/openai-401-invalid-key.http")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	got := string(JSON(body, []string{"sk-FAKE0123456789abcdef"}))
	if strings.Contains(got, "sk-FAKE") || !strings.Contains(got, "Incorrect API key provided: [redacted]. You can find") {
		t.Errorf("expected the masked key redacted, got %s", got)
	}
}

// A URL is shown with its userinfo, query values and fragment masked.
func TestURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://api.openai.com/v1":                                            "https://api.openai.com/v1",
		"http://user:pass@127.0.0.1:1/v1":                                      "http://xxxxx@127.0.0.1:1/v1",
		"https://sk-token@gw.example.com/v1":                                   "https://xxxxx@gw.example.com/v1",
		"https://r.openai.azure.com/openai?api-key=abc&api-version=2024-10-21": "https://r.openai.azure.com/openai?api-key=xxxxx&api-version=xxxxx",
		"https://h/v1?sv=2024&sig=abc%2Bdef&flag#frag":                         "https://h/v1?sv=xxxxx&sig=xxxxx&xxxxx#xxxxx",
		"http://[::1%zz/":                                                      "",
	} {
		if got := URL(in); got != want {
			t.Errorf("%s: expected %s, got %s", in, want, got)
		}
	}
}

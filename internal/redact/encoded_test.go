package redact

import (
	"encoding/base64"
	"net/url"
	"strings"
	"testing"
)

// A configured secret echoed encoded is redacted as when it comes plain:
// JSON-escaped in a body that is not whole JSON (an error cut at its
// bound), URL-encoded in a link or a Location, as HTML character
// references in an error page, and in base64 (an echoed Basic
// Authorization, a key alone); what stays shows none of it.
func TestEncodedSecretsAreRedacted(t *testing.T) {
	key := "sk-proj-Abcdefghijklmnopqrstuvwx1234"
	azure := "Zq8xWv2P+a/bc9Kd3mN4pQ==" // base64, with '+' and '/'
	b64 := base64.StdEncoding.EncodeToString
	for _, msg := range []string{
		`{"error":{"message":"bad key sk\u002dproj\u002dAbcdefghijklmnopqrstuvwx1234 in`,
		`{"error":{"message":"bad key \u0073\u006b\u002d\u0070roj-Abcdefghijklmnop`,
		"Location: https://login.example/?key=" + url.QueryEscape(azure) + "&next=1",
		"https://example/keys/" + url.PathEscape(azure) + "/revoke",
		`<html><body><p>Invalid key &#115;&#x6B;&#45;proj&hyphen;Abcdefghijklmnopqrstuvwx1234</p></body></html>`,
		`<p>Invalid key Zq8xWv2P&plus;a&#x2F;bc9Kd3mN4pQ&equals;&equals;</p>`,
		"Authorization: Basic " + b64([]byte("user:"+key)),
		"echo " + b64([]byte(key)) + " done",
		"echo " + base64.URLEncoding.EncodeToString([]byte("x"+azure)),
	} {
		got := String(msg, []string{key, azure})
		if !strings.Contains(got, Placeholder) || strings.Contains(got, "Abcdefghijklmnop") || strings.Contains(got, "bc9Kd3mN4pQ") {
			t.Errorf("%q became %q", msg, got)
		}
		for _, enc := range []string{b64([]byte(key))[8:30], url.QueryEscape(azure), "9Kd3mN4pQ"} {
			if strings.Contains(got, enc) {
				t.Errorf("%q became %q, which still holds %q", msg, got, enc)
			}
		}
	}
}

// Escapes that show no secret stay as they came.
func TestEscapesWithoutSecretsStay(t *testing.T) {
	for _, msg := range []string{
		`{"error":{"message":"50% of quota used \u2014 retry &amp; wait: https://x/a%20b"`,
		"<p>Rate limit &#8212; try again</p>",
	} {
		if got := String(msg, []string{"Zq8xWv2P+a/bc9Kd3mN4pQ=="}); got != msg {
			t.Errorf("%q became %q", msg, got)
		}
	}
}

// A text cut at a bound (an error body read to 64 KiB) that ends in the
// middle of a configured secret has that start of it redacted: 8 of its
// characters or more, at the very end.
func TestSecretCutAtTheEndIsRedacted(t *testing.T) {
	key := "0123456789abcdef0123456789abcdef" // an Azure key: no shape of its own
	for _, n := range []int{8, 20, 31} {
		msg := `{"error":{"detail":"` + key[:n]
		if got := String(msg, []string{key}); got != `{"error":{"detail":"`+Placeholder {
			t.Errorf("cut after %d characters: got %q", n, got)
		}
	}
	if got := String("id 0123456", []string{key}); got != "id 0123456" {
		t.Errorf("7 characters are no secret's start: got %q", got)
	}
}

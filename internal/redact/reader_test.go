package redact

import (
	"encoding/base64"
	"io"
	"net/url"
	"strings"
	"testing"
	"testing/iotest"
)

// Reader redacts a secret whole, URL-encoded and in base64 however the
// body is cut into reads (one byte at a time here), and keeps the body's
// length.
func TestReaderRedactsAcrossReads(t *testing.T) {
	key := "sk-proj-Reader0123456789abcdef+/="
	body := "a " + key + " b " + url.QueryEscape(key) + " c " + base64.StdEncoding.EncodeToString([]byte("u:"+key)) + " " + key[:5]
	out, err := io.ReadAll(Reader(iotest.OneByteReader(strings.NewReader(body)), []string{key, "short"}))
	got := string(out)
	if err != nil || len(got) != len(body) || strings.Contains(got, "Reader0123") || strings.Contains(got, "%2B%2F%3D") ||
		strings.Contains(got, base64.StdEncoding.EncodeToString([]byte("u:" + key))[4:20]) || !strings.HasSuffix(got, " "+key[:5]) {
		t.Errorf("got %q (%v) from %q", got, err, body)
	}
}

// An answer that ends in the middle of a secret has that start of it
// redacted.
func TestReaderRedactsACutSecret(t *testing.T) {
	key := "sk-proj-Reader0123456789abcdef"
	out, _ := io.ReadAll(Reader(strings.NewReader("data: "+key[:12]), []string{key}))
	if string(out) != "data: [redacted]xx" {
		t.Errorf("got %q", out)
	}
}

// Answer runs on every event of a stream, with its deployment's secrets.
func BenchmarkAnswerEvent(b *testing.B) {
	secrets := []string{"sk-proj-" + strings.Repeat("Ab3dE6gH9jK2mN5pQ8sT", 4)}
	ev := []byte(`{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}`)
	b.ReportAllocs()
	for b.Loop() {
		if out := Answer(ev, secrets); len(out) != len(ev) {
			b.Fatal("changed")
		}
	}
}

// Answer looks for the secrets its list holds when it is called: a list
// changed in place (its first element's address the same) is not taken
// for the one seen before.
func TestAnswerFollowsTheSecrets(t *testing.T) {
	secrets := []string{"secret-one-1234"}
	if got := string(Answer([]byte(`{"x":"secret-one-1234"}`), secrets)); strings.Contains(got, "secret-one") {
		t.Errorf("not redacted: %s", got)
	}
	secrets[0] = "secret-two-5678"
	if got := string(Answer([]byte(`{"x":"secret-two-5678 secret-one-1234"}`), secrets)); strings.Contains(got, "secret-two") || !strings.Contains(got, "secret-one") {
		t.Errorf("after the list changed: %s", got)
	}
}

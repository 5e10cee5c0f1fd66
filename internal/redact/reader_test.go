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

package redact

import (
	"encoding/base64"
	"net/url"
	"strings"
	"testing"
)

// fuzzKeyChars are the characters of providers' keys (OpenAI's sk-proj-...,
// Anthropic's sk-ant-..., Azure's hex, Google's AIza..., Groq's gsk_...).
const fuzzKeyChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"

// separators stand either side of a key in providers' messages.
var separators = []string{" ", ": ", `"`, "'", "=", "(", ")", ", ", ". ", "\n", "`", "[", "]"}

// masks are what providers put in place of a key's middle.
var masks = []string{"*", "****", "***************************************", "...", "…", "•••", "·····", "..", "*…*"}

// keyOf makes a key of providers' characters from random bytes (those
// outside them mapped in): at least one character, at most 200.
func keyOf(raw []byte) string {
	if len(raw) == 0 {
		raw = []byte{0}
	}
	if len(raw) > 200 {
		raw = raw[:200]
	}
	b := make([]byte, len(raw))
	for i, c := range raw {
		if strings.IndexByte(fuzzKeyChars, c) < 0 {
			c = fuzzKeyChars[int(c)%len(fuzzKeyChars)]
		}
		b[i] = c
	}
	return string(b)
}

// shape is how a provider shows the key: whole, or its first p and last
// q characters either side of a mask (either side may be empty: "****fXYZ",
// "sk-FAKE****").
func shape(key string, how, p, q uint8) string {
	if how%2 == 0 {
		return key
	}
	pp, qq := min(int(p), len(key)), min(int(q), len(key))
	return key[:pp] + masks[int(how/2)%len(masks)] + key[len(key)-qq:]
}

// FuzzRedactMaskedKey: a configured key of any length embedded in any
// provider text, whole or in any masked shape, leaves the redacted text
// with no more copies of the key, nor of its first or last 4 characters,
// than the text around it had (a fragment that long from either end
// contains one of those).
func FuzzRedactMaskedKey(f *testing.F) {
	f.Add([]byte("sk-proj-Q3vLd82mNcX0aTfXYZ"), "Incorrect API key provided:", ". You can find your API key at", uint8(1), uint8(6), uint8(4), uint8(0))
	f.Add([]byte("sk-proj-Q3vLd82mNcX0aTfXYZ"), `{"error":{"message":"Authentication Fails, Your api key:`, ` is invalid"}}`, uint8(3), uint8(0), uint8(4), uint8(0))
	f.Add([]byte("sk-FAKE0123456789"), "Incorrect API key provided:", ". You can find", uint8(3), uint8(7), uint8(0), uint8(4))
	f.Add([]byte("x7Q2p"), `{"error":{"message":"Invalid API key`, `","type":"invalid_request_error"}}`, uint8(0), uint8(0), uint8(0), uint8(1))
	f.Add([]byte("ab"), "a table of abbreviations, key", "refused", uint8(0), uint8(0), uint8(0), uint8(2))
	f.Add([]byte("0123456789abcdef0123456789abcdef"), "Access denied: key", "is not valid for region eastus", uint8(7), uint8(4), uint8(4), uint8(3))
	f.Add([]byte("aaaaaaaaaaaa"), "aaaa***", "***aaaa", uint8(1), uint8(5), uint8(5), uint8(5))
	f.Add([]byte("sk-ant-api03-abcdefghijklmnop"), "sk-ant-", "…mnop", uint8(5), uint8(10), uint8(3), uint8(6))
	f.Fuzz(func(t *testing.T, raw []byte, before, after string, how, p, q, sep uint8) {
		key := keyOf(raw)
		s := separators[int(sep)%len(separators)]
		shown := shape(key, how, p, q)
		msg := before + s + shown + s + after
		got := strings.ReplaceAll(String(msg, []string{key}), Placeholder, "\x00")
		frags := []string{key}
		if len(key) >= 4 {
			frags = append(frags, key[:4], key[len(key)-4:])
		}
		for _, frag := range frags {
			if n, around := strings.Count(got, frag), strings.Count(before, frag)+strings.Count(after, frag); n > around {
				t.Fatalf("key %q shown as %q in %q: %q kept %d times (the text around it has %d): %q", key, shown, msg, frag, n, around, got)
			}
		}
	})
}

// encodings are how a provider may echo a key encoded (see decode and
// encodedForms).
var encodings = []func(string) string{
	url.QueryEscape,
	func(k string) string { return base64.StdEncoding.EncodeToString([]byte(k)) },
	func(k string) string { return base64.URLEncoding.EncodeToString([]byte("u:" + k)) },
	func(k string) string { return strings.ReplaceAll(k, "-", `\u002d`) },
	func(k string) string { return strings.ReplaceAll(k, "-", "&#45;") },
}

// FuzzRedactEncodedKey: a configured key of 8 characters or more (with
// '+', '/' and '=', as base64 secrets have) echoed encoded in any text,
// by String and by Answer, leaves no more copies of that encoded form,
// nor of its middle (what every alignment shows of it), than the text
// around it had.
func FuzzRedactEncodedKey(f *testing.F) {
	f.Add([]byte("sk-proj-Q3vLd82mNcX0aTfXYZ"), "Location: https://x/?key=", "&next=1", uint8(0), uint8(0))
	f.Add([]byte("Zq8xWv2P+a/bc9Kd3mN4pQ=="), "Authorization: Basic ", "", uint8(2), uint8(3))
	f.Add([]byte("sk-ant-api03-abcdefghijklmnop"), `{"error":{"message":"key `, `"`, uint8(3), uint8(1))
	f.Fuzz(func(t *testing.T, raw []byte, before, after string, enc, plus uint8) {
		key := []byte(keyOf(raw))
		for i := range key {
			if plus&(1<<(i%8)) != 0 && i%5 == 0 {
				key[i] = "+/="[i%3]
			}
		}
		if len(key) < AnywhereLength+4 {
			return
		}
		shown := encodings[int(enc)%len(encodings)](string(key))
		msg := before + " " + shown + " " + after
		for name, got := range map[string]string{"String": String(msg, []string{string(key)}), "Answer": string(Answer([]byte(msg), []string{string(key)}))} {
			if name == "Answer" && int(enc)%len(encodings) >= 3 {
				continue // escapes are String's
			}
			got = strings.ReplaceAll(got, Placeholder, "\x00")
			frag := shown[len(shown)/2-2 : len(shown)/2+2]
			if n, around := strings.Count(got, frag), strings.Count(before, frag)+strings.Count(after, frag); n > around {
				t.Fatalf("%s: key %q shown as %q in %q: %q kept %d times (around: %d): %q", name, key, shown, msg, frag, n, around, got)
			}
		}
	})
}

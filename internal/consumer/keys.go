package consumer

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
)

// Keys maps API keys to consumers by their SHA-256 hashes: the keys
// themselves are never held. The zero Keys knows no key.
type Keys struct {
	entries []keyEntry
}

type keyEntry struct {
	consumer string
	hash     [sha256.Size]byte
}

// LoadKeys reads a keys file (ParseKeys) at path.
func LoadKeys(path string) (*Keys, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("keys: %v", err)
	}
	defer f.Close()
	return ParseKeys(f, path)
}

// ParseKeys reads a keys file from r: one key a line, "<consumer>
// <sha256 hex of the key>" (64 hex digits, either case), as
// `printf %s "$KEY" | sha256sum` prints the hash; blank lines and lines
// starting with # are skipped, and a field starting with # begins a
// comment to the end of its line (as in a Caddyfile). A line of another shape, a hash that is not
// 64 hex digits, or one hash given twice is an error naming source and the
// line (never its hash). One consumer may have several keys.
func ParseKeys(r io.Reader, source string) (*Keys, error) {
	k := &Keys{}
	seen := map[[sha256.Size]byte]int{}
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		fields := uncommented(strings.Fields(sc.Text()))
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("keys %s:%d: expected \"<consumer> <sha256 hex of the key>\", got %d fields", source, line, len(fields))
		}
		var e keyEntry
		e.consumer = fields[0]
		b, err := hex.DecodeString(fields[1])
		if err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("keys %s:%d: the hash of consumer %s is not 64 hex digits (a SHA-256 of the key, such as printf %%s \"$KEY\" | sha256sum prints)", source, line, e.consumer)
		}
		copy(e.hash[:], b)
		if prev, dup := seen[e.hash]; dup {
			return nil, fmt.Errorf("keys %s:%d: the same key's hash as line %d", source, line, prev)
		}
		seen[e.hash] = line
		k.entries = append(k.entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("keys %s: %v", source, err)
	}
	return k, nil
}

// uncommented returns fields up to the first that starts with #.
func uncommented(fields []string) []string {
	for i, f := range fields {
		if strings.HasPrefix(f, "#") {
			return fields[:i]
		}
	}
	return fields
}

// Len returns how many keys k holds.
func (k *Keys) Len() int { return len(k.entries) }

// Consumers returns the consumers k names, each once, in the file's
// order.
func (k *Keys) Consumers() []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range k.entries {
		if !seen[e.consumer] {
			seen[e.consumer] = true
			out = append(out, e.consumer)
		}
	}
	return out
}

// Lookup returns the consumer of key: its SHA-256 is compared with every
// entry's in constant time (all entries, whichever matches), so that the
// time taken tells nothing of the hashes. ok false for an empty or
// unknown key.
func (k *Keys) Lookup(key string) (consumer string, ok bool) {
	if k == nil || key == "" {
		return "", false
	}
	h := sha256.Sum256([]byte(key))
	found := -1
	for i := range k.entries {
		if subtle.ConstantTimeCompare(h[:], k.entries[i].hash[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return "", false
	}
	return k.entries[found].consumer, true
}

// KeyOf returns the API key a client sent: Authorization: Bearer <key>
// (the OpenAI SDKs') or x-api-key (the Anthropic SDKs'), the first when
// both are set; "" when neither is.
func KeyOf(h http.Header) string {
	if auth := h.Get("Authorization"); len(auth) > 7 && strings.EqualFold(auth[:7], "Bearer ") {
		return strings.TrimSpace(auth[7:])
	}
	return strings.TrimSpace(h.Get("X-Api-Key"))
}

// StripKey removes the client's credentials from h (Authorization,
// x-api-key), so that what the router passes on never carries them.
func StripKey(h http.Header) {
	h.Del("Authorization")
	h.Del("X-Api-Key")
}

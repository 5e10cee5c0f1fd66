package consumer

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
	byHash  map[[sha256.Size]byte]int // entries' index by hash
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
// `printf %s "$KEY" | sha256sum` prints the hash; blank lines, lines
// starting with #, a # comment after the hash and a UTF-8 byte-order mark
// at the file's start are skipped. A line of another shape or over 64
// KiB, a hash that is not 64 hex digits, or one hash given twice is an
// error naming source and the line (never its hash). One consumer may
// have several keys.
func ParseKeys(r io.Reader, source string) (*Keys, error) {
	k := &Keys{byHash: map[[sha256.Size]byte]int{}}
	seen := map[[sha256.Size]byte]int{} // hash -> line
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if line == 1 {
			text = strings.TrimPrefix(text, "\ufeff") // a byte-order mark (Windows editors)
		}
		fields := uncommented(strings.Fields(text)) // a comment, of the line or after its hash
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
		k.byHash[e.hash] = len(k.entries)
		k.entries = append(k.entries, e)
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return nil, fmt.Errorf("keys %s:%d: a line longer than %d KiB: not a keys file's", source, line+1, bufio.MaxScanTokenSize>>10)
	} else if err != nil {
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

// Lookup returns the consumer of key, found by its SHA-256 in a map, so
// that a file of 100,000 keys takes no longer than one of 10
// (BenchmarkKeysLookup). The lookup's time may tell of the hashes (how
// far a client's key's hash matches a stored one), which give no key: a
// key cannot be found from its SHA-256. ok false for an empty or unknown
// key.
func (k *Keys) Lookup(key string) (consumer string, ok bool) {
	if k == nil || key == "" {
		return "", false
	}
	i, ok := k.byHash[sha256.Sum256([]byte(key))]
	if !ok {
		return "", false
	}
	return k.entries[i].consumer, true
}

// KeyOf returns the API key a client sent: Authorization: Bearer <key>
// (the OpenAI SDKs') or x-api-key (the Anthropic SDKs'), the first when
// both are set; "" when neither is.
func KeyOf(h http.Header) string {
	if key := bearerOf(h); key != "" {
		return key
	}
	return strings.TrimSpace(h.Get("X-Api-Key"))
}

// bearerOf returns the key of Authorization: Bearer <key> ("" for none
// or another scheme).
func bearerOf(h http.Header) string {
	if auth := h.Get("Authorization"); len(auth) > 7 && strings.EqualFold(auth[:7], "Bearer ") {
		return strings.TrimSpace(auth[7:])
	}
	return ""
}

// LookupHeader returns the consumer of the key a client sent (KeyOf),
// trying the Bearer's, then x-api-key's when k does not know the first
// (the Anthropic SDKs send both when given both an auth token and an API
// key). key is what the client sent ("" for nothing), for the 401's
// message.
func (k *Keys) LookupHeader(h http.Header) (consumer, key string, ok bool) {
	key = KeyOf(h)
	if consumer, ok = k.Lookup(bearerOf(h)); ok {
		return consumer, key, true
	}
	consumer, ok = k.Lookup(strings.TrimSpace(h.Get("X-Api-Key")))
	return consumer, key, ok
}

// StripKey removes the client's credentials from h (Authorization,
// x-api-key), so that what the router passes on never carries them.
func StripKey(h http.Header) {
	h.Del("Authorization")
	h.Del("X-Api-Key")
}

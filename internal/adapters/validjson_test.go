package adapters

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// validJSON replaces encoding/json.Valid on the stream path: it must say
// what json.Valid says of every input, valid or broken. The inputs: hand
// cases at each rule's edge, every testdata file and each of its lines
// (the streams' events), and a hundred thousand random mutations of them
// (bytes changed, cut, doubled, dropped).
func TestValidJSONIsJSONValid(t *testing.T) {
	cases := []string{``, ` `, `{}`, `[]`, `{"a":1}`, `{"a":1,}`, `[1,]`, `[,1]`, `{"a" 1}`, `{a:1}`, `"x`, `"\u00e9"`, `"\u00g9"`, `"\x"`,
		"\"a\tb\"", `"\/"`, `-`, `-0`, `01`, `1.`, `1.5e`, `1.5e+3`, `1E-0`, `.5`, `tru`, `true `, ` null`, `nul`, `falsey`, `{"a":[1,{"b":null}]}`,
		`{"a":1}}`, `[[[]]`, strings.Repeat("[", 10000) + strings.Repeat("]", 10000), strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		"\"\xff\xfe\"", "{\"a\":1}\n", `{"a":"b"`, `{"a"}`, `{,}`, `1 2`, "\x00", `"\`, `"\u12`, `-a`, `1e5x`, `{"a":1 "b":2}`}
	inputs := append([][]byte{}, bytesOf(cases)...)
	files, _ := filepath.Glob("testdata/*")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		inputs = append(inputs, b)
		for line := range strings.SplitSeq(string(b), "\n") {
			inputs = append(inputs, []byte(strings.TrimPrefix(line, "data: ")))
		}
	}
	for _, in := range inputs {
		if got, want := validJSON(in), json.Valid(in); got != want {
			t.Errorf("validJSON(%.80q) = %v, json.Valid says %v", in, got, want)
		}
	}
	rng := rand.New(rand.NewPCG(32, 2))
	alphabet := []byte(`{}[]",:\ 0123456789.eE+-tfnulrsaxu` + "\t\n\x01\xff")
	for n := 0; n < 100000; n++ {
		in := append([]byte(nil), inputs[rng.IntN(len(inputs))]...)
		if len(in) > 400 {
			start := rng.IntN(len(in) - 400)
			in = in[start : start+400]
		}
		for k := rng.IntN(3) + 1; k > 0 && len(in) > 0; k-- {
			p := rng.IntN(len(in))
			switch rng.IntN(4) {
			case 0:
				in[p] = alphabet[rng.IntN(len(alphabet))]
			case 1:
				in = in[:p]
			case 2:
				in = append(in[:p], in[p+1:]...)
			case 3:
				in = append(in[:p], append([]byte{alphabet[rng.IntN(len(alphabet))]}, in[p:]...)...)
			}
		}
		if got, want := validJSON(in), json.Valid(in); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid says %v", in, got, want)
		}
	}
}

func bytesOf(ss []string) [][]byte {
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}

// FuzzValidJSON: go test -fuzz FuzzValidJSON ./internal/adapters/.
func FuzzValidJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,2.5e3,"x\u00e9"],"b":null}`, `[true,false]`, `"\n"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if got, want := validJSON(in), json.Valid(in); got != want {
			t.Errorf("validJSON(%q) = %v, json.Valid says %v", in, got, want)
		}
	})
}

// BenchmarkValidJSON: a streamed chat chunk, by json.Valid and validJSON.
func BenchmarkValidJSON(b *testing.B) {
	ev := []byte(`{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}`)
	b.Run("json.Valid", func(b *testing.B) {
		for b.Loop() {
			json.Valid(ev)
		}
	})
	b.Run("validJSON", func(b *testing.B) {
		for b.Loop() {
			validJSON(ev)
		}
	})
}

// indexKey finds a quoted key where bytes.Index does: first, last and
// overlapping places, the key's tail without its quote, and random bytes
// of the keys' own letters.
func TestIndexKeyIsBytesIndex(t *testing.T) {
	keys := []string{`"error"`, `"finish_reason"`, `"usage"`}
	cases := []string{``, `"`, `error"`, `"error"`, `x"error"`, `error""error"`, `"usage"`, `usage"usage"`, `{"a":"usage","usage":{}}`, `""usage"`, `"us"usage"`}
	for _, c := range cases {
		for _, k := range keys {
			if got, want := indexKey([]byte(c), k), bytes.Index([]byte(c), []byte(k)); got != want {
				t.Errorf("indexKey(%q, %s) = %d, bytes.Index says %d", c, k, got, want)
			}
		}
	}
	rng := rand.New(rand.NewPCG(32, 3))
	alphabet := []byte(`"usagerorfinsh_:{`)
	for range 100000 {
		in := make([]byte, rng.IntN(40))
		for i := range in {
			in[i] = alphabet[rng.IntN(len(alphabet))]
		}
		k := keys[rng.IntN(len(keys))]
		if got, want := indexKey(in, k), bytes.Index(in, []byte(k)); got != want {
			t.Fatalf("indexKey(%q, %s) = %d, bytes.Index says %d", in, k, got, want)
		}
	}
}

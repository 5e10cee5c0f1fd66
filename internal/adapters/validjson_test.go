package adapters

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// jsonbody.Valid replaces encoding/json.Valid on the stream path: it must say
// what json.Valid says of every input, valid or broken (see jsonCorpus).
func TestValidJSONIsJSONValid(t *testing.T) {
	jsonCorpus(func(in []byte) {
		if got, want := jsonbody.Valid(in), json.Valid(in); got != want {
			t.Fatalf("jsonbody.Valid(%.80q) = %v, json.Valid says %v", in, got, want)
		}
	})
}

// The marks scanJSON notes in a chunk are what the byte searches it
// replaces (chatStream.Decode's and provider.UsageCounter's) find, on
// every valid input of jsonCorpus and on keys spelled at their edges.
func TestChunkMarksAreTheSearches(t *testing.T) {
	n := 0
	jsonCorpus(func(in []byte) {
		var m chunkMarks
		if !scanJSON(in, &m) {
			return
		}
		n++
		usage := byte(0)
		if v := valueStart(in, `"usage"`); v >= 0 {
			usage = byte(v)
		}
		want := chunkMarks{err: indexKey(in, `"error"`) >= 0, finish: valueStart(in, `"finish_reason"`) >= 0,
			sage: bytes.Contains(in, []byte(`sage"`)), reason: bytes.Contains(in, []byte(`_reason":"`)), usage: usage}
		if m != want {
			t.Fatalf("%q: marks %+v, the searches find %+v", in, m, want)
		}
	})
	if n < 1000 {
		t.Errorf("only %d valid inputs", n)
	}
}

// A chunk the Chat adapter marks Plain is one a UsageCounter reads as
// it reads it unmarked: the same usage, finish reasons and what goes to
// the client, with the usage asked for or not.
func TestPlainChunksCountAsUnmarked(t *testing.T) {
	plain := 0
	jsonCorpus(func(in []byte) {
		for _, include := range []bool{false, true} {
			s := &chatStream{choices: 1, includeUsage: include}
			ev, kind, _ := s.Decode(&provider.Event{Data: in})
			if kind == provider.EventError || !ev.Plain {
				continue
			}
			plain++
			marked, unmarked := provider.NewUsageCounter(provider.Chat, true), provider.NewUsageCounter(provider.Chat, true)
			got, gotOK := marked.Relay(ev)
			ev.Plain = false
			want, wantOK := unmarked.Relay(ev)
			gu, gs := marked.Usage()
			wu, ws := unmarked.Usage()
			if gotOK != wantOK || !bytes.Equal(got.Data, want.Data) || gu != wu || gs != ws ||
				!slices.Equal(marked.FinishReasons(), unmarked.FinishReasons()) {
				t.Fatalf("%q: marked Plain, counted %+v %v %v, unmarked %+v %v %v", in, gu, marked.FinishReasons(), gotOK, wu, unmarked.FinishReasons(), wantOK)
			}
		}
	})
	if plain < 1000 {
		t.Errorf("only %d chunks marked Plain", plain)
	}
}

// jsonCorpus calls each with inputs for a JSON reader: hand cases at each
// rule's edge and at the chunk keys' spellings, every testdata file and
// recorded stream and each of their lines (the streams' events), and a hundred thousand random
// mutations of them (bytes changed, cut, doubled, dropped).
func jsonCorpus(each func(in []byte)) {
	cases := []string{``, ` `, `{}`, `[]`, `{"a":1}`, `{"a":1,}`, `[1,]`, `[,1]`, `{"a" 1}`, `{a:1}`, `"x`, `"\u00e9"`, `"\u00g9"`, `"\x"`,
		"\"a\tb\"", `"\/"`, `-`, `-0`, `01`, `1.`, `1.5e`, `1.5e+3`, `1E-0`, `.5`, `tru`, `true `, ` null`, `nul`, `falsey`, `{"a":[1,{"b":null}]}`,
		`{"a":1}}`, `[[[]]`, strings.Repeat("[", 10000) + strings.Repeat("]", 10000), strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		"\"\xff\xfe\"", "{\"a\":1}\n", `{"a":"b"`, `{"a"}`, `{,}`, `1 2`, "\x00", `"\`, `"\u12`, `-a`, `1e5x`, `{"a":1 "b":2}`,
		`{"usage":{}}`, `{"usage" : {"a":1}}`, `{"usage":null,"usage":{"a":1}}`, `{"usage":"x","usage":{}}`, `{"a":"usage"}`, `{"x":"\"usage"}`,
		`{"Usage":{}}`, `{"\u0075sage":{}}`, `{"message":1}`, `{"finish_reason":"stop"}`, `{"finish_reason" : null}`, `{"finish_reason":0}`,
		`{"a\"finish_reason":"x"}`, `{"stop_reason":"end_turn"}`, `{"stop_reason": "end_turn"}`, `{"x_reason":1}`, `{"error":null}`,
		`{"type":"error"}`, `{"a":"\"error"}`, `{"Error":{}}`, `["finish_reason",1]`, `{"usage":{"usage":null}}`}
	inputs := append([][]byte{}, bytesOf(cases)...)
	files, _ := filepath.Glob("testdata/*")
	streams, _ := filepath.Glob("testdata/streams/*.sse")
	for _, f := range append(files, streams...) {
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
		each(in)
	}
	rng := rand.New(rand.NewPCG(32, 2))
	alphabet := []byte(`{}[]",:\ 0123456789.eE+-tfnulrsaxu_g` + "\t\n\x01\xff")
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
		each(in)
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
		if got, want := jsonbody.Valid(in), json.Valid(in); got != want {
			t.Errorf("jsonbody.Valid(%q) = %v, json.Valid says %v", in, got, want)
		}
	})
}

// BenchmarkValidJSON: a streamed chat chunk, by json.Valid and jsonbody.Valid.
func BenchmarkValidJSON(b *testing.B) {
	ev := []byte(`{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}`)
	b.Run("json.Valid", func(b *testing.B) {
		for b.Loop() {
			json.Valid(ev)
		}
	})
	b.Run("jsonbody.Valid", func(b *testing.B) {
		for b.Loop() {
			jsonbody.Valid(ev)
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

// valueStart returns the first byte of a non-null value of key (quoted)
// anywhere in data, -1 when key has none: the search chatStream.Decode
// made before chunkMarks, which they must match.
func valueStart(data []byte, key string) int {
	for {
		i := indexKey(data, key)
		if i < 0 {
			return -1
		}
		data = data[i+len(key):]
		j := jsonbody.SkipSpace(data, 0)
		if j < len(data) && data[j] == ':' {
			j = jsonbody.SkipSpace(data, j+1)
			if j < len(data) && data[j] != 'n' {
				return int(data[j])
			}
		}
	}
}

// indexKey is bytes.Index of key (quoted) in data, looking for what
// follows its opening quote: a stream's events are full of quotes, each of
// which would stop a look for the quote.
func indexKey(data []byte, key string) int {
	for off := 0; ; {
		i := bytes.Index(data[off:], []byte(key[1:]))
		if i < 0 {
			return -1
		}
		if i += off; i > 0 && data[i-1] == key[0] {
			return i - 1
		}
		off = i + 1
	}
}

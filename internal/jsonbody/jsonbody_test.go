package jsonbody

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

func TestSetString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"model":"fast","messages":[]}`, `{"model":"gpt-4o","messages":[]}`},
		{`{"messages":[{"content":"the \"model\": x"}],"model" : "fast"}`, `{"messages":[{"content":"the \"model\": x"}],"model" : "gpt-4o"}`},
		{`{"nested":{"model":"keep"},"model":null}`, `{"nested":{"model":"keep"},"model":"gpt-4o"}`},
		{`{"messages":[]}`, `{"model":"gpt-4o","messages":[]}`},
		{` { } `, ` {"model":"gpt-4o" } `},
	} {
		got, err := SetString([]byte(tc.in), "model", "gpt-4o")
		if err != nil || string(got) != tc.want {
			t.Errorf("SetString(%s): expected %s, got %s (%v)", tc.in, tc.want, got, err)
		}
		if !json.Valid(got) {
			t.Errorf("SetString(%s) gave invalid JSON %s", tc.in, got)
		}
	}
	for _, bad := range []string{`[1,2]`, `"x"`, ``, `{"model":`} {
		if _, err := SetString([]byte(bad), "model", "m"); err == nil {
			t.Errorf("SetString(%q): expected an error", bad)
		}
	}
	// A model name needing escapes stays valid JSON.
	got, _ := SetString([]byte(`{"model":"a"}`), "model", "we\"ird\n")
	var v struct{ Model string }
	if err := json.Unmarshal(got, &v); err != nil || v.Model != "we\"ird\n" {
		t.Errorf("expected an escaped model name, got %s", got)
	}
}

func TestCheckKeys(t *testing.T) {
	names := []string{"model", "stream"}
	for body, ok := range map[string]bool{
		`{"model":"a","stream":true,"messages":[]}`:          true,
		`{"model":"a","model":"b"}`:                          false,
		`{"model":"a","MODEL":"b"}`:                          false,
		`{"Stream":true}`:                                    false,
		`{"mod\u0065l":"a","model":"b"}`:                     false,
		`{"messages":[{"model":"x"}],"extra":{"model":"y"}}`: true,
		`[1]`: false,
	} {
		if err := CheckKeys([]byte(body), names...); (err == nil) != ok {
			t.Errorf("CheckKeys(%s): expected ok=%v, got %v", body, ok, err)
		}
	}
	// An escaped key is still the key: the model is replaced, not duplicated.
	out, err := SetString([]byte(`{"mod\u0065l":"fast"}`), "model", "up")
	if err != nil || string(out) != `{"mod\u0065l":"up"}` {
		t.Errorf("expected the escaped key's value replaced, got %s %v", out, err)
	}
}

func TestString(t *testing.T) {
	for _, in := range []string{
		`"plain"`, `""`, `"line\nbreak\ttab \"quoted\" back\\slash \/ \b\f\r"`,
		`"\u00e9t\u00E9 \ud83d\ude00 lone \ud83d end"`, "\"caf\xc3\xa9\"", "\"bad \xff byte\"",
	} {
		var want string
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		got, ok := String([]byte(in))
		if !ok || got != want {
			t.Errorf("String(%s): expected %q, got %q (%v)", in, want, got, ok)
		}
	}
	for _, bad := range []string{``, `"`, `x`, `12`, `"trailing\"`} {
		if _, ok := String([]byte(bad)); ok {
			t.Errorf("String(%s): expected not ok", bad)
		}
	}
}

// FuzzString: String decodes every JSON string as encoding/json does.
func FuzzString(f *testing.F) {
	for _, s := range []string{`"a"`, `"\n\u0041\ud83d\ude00"`, `"\"x\""`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want string
		if json.Unmarshal(raw, &want) != nil || len(raw) == 0 || raw[0] != '"' {
			return
		}
		if got, ok := String(raw); !ok || got != want {
			t.Fatalf("String(%q) = %q, %v; encoding/json says %q", raw, got, ok, want)
		}
	})
}

// FuzzRequestBody: the body scanners agree with encoding/json: a body they
// accept stays valid JSON with the model set, whatever its shape.
func FuzzRequestBody(f *testing.F) {
	for _, s := range []string{`{"model":"fast","messages":[{"role":"user","content":"hi"}]}`,
		`{"mod\u0065l":"a"}`, `{"model":"a","model":"b"}`, `{ }`, `{"a":{"model":[1,{"x":"\"}"}]}}`, `[1]`, `"x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		_ = CheckKeys(body, "model", "stream")
		if !json.Valid(body) {
			return
		}
		out, err := SetString(body, "model", "up-model")
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("SetString(%q) gave invalid JSON %q", body, out)
		}
		if CheckKeys(body, "model") == nil {
			var v struct{ Model string }
			if json.Unmarshal(out, &v) == nil && v.Model != "up-model" {
				t.Fatalf("SetString(%q) = %q: model is %q", body, out, v.Model)
			}
		}
	})
}

// BenchmarkSetString4KB is the openai and azure adapters' body rewrite: the
// deployment's model in place of the model group, one copy of the body.
func BenchmarkSetString4KB(b *testing.B) {
	body := body4KB(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		out, err := SetString(body, "model", "gpt-4o-mini-2024-07-18")
		if err != nil {
			b.Fatal(err)
		}
		bytesSink = out
	}
}

// body4KB is a Chat Completions body of about 4 KB.
func body4KB(tb testing.TB) []byte {
	tb.Helper()
	b, err := json.Marshal(map[string]any{"model": "smart", "max_tokens": 512, "messages": []map[string]string{
		{"role": "system", "content": "You are a careful assistant. " + strings.Repeat("x", 3900)},
		{"role": "user", "content": "Summarize the report."}}})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

var bytesSink []byte

func TestEachElement(t *testing.T) {
	var got []string
	body := []byte(` [ {"role":"user","content":"a, ]"} , null,"x\"]", [1,[2]] ,3 ]`)
	err := EachElement(body, func(s, e int) bool {
		got = append(got, string(body[s:e]))
		return true
	})
	want := []string{`{"role":"user","content":"a, ]"}`, `null`, `"x\"]"`, `[1,[2]]`, `3`}
	if err != nil || strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("expected %q, got %q (%v)", want, got, err)
	}
	for _, bad := range []string{`{}`, `[1,`, `"x"`, ``, `[{"a":]`} {
		if err := EachElement([]byte(bad), func(int, int) bool { return true }); err == nil {
			t.Errorf("%q: expected an error", bad)
		}
	}
}

// BenchmarkCheckKeysMany checks a body of 100,000 keys: linear time (a
// quadratic check took 16 s).
func BenchmarkCheckKeysMany(b *testing.B) {
	var body strings.Builder
	body.WriteString(`{"model":"m"`)
	for i := 0; i < 100000; i++ {
		body.WriteString(`,"k` + strconv.Itoa(i) + `":0`)
	}
	body.WriteString("}")
	raw := []byte(body.String())
	for b.Loop() {
		if err := CheckKeys(raw, "model", "stream"); err != nil {
			b.Fatal(err)
		}
	}
}

func TestWithout(t *testing.T) {
	for in, want := range map[string]string{
		`{"a":1,"usage":{"x":[1,2]},"b":2}`: `{"a":1,"b":2}`,
		`{"usage":{"x":1},"b":2}`:           `{"b":2}`,
		`{"a":1, "usage" : null }`:          `{"a":1 }`,
		`{"usage":1}`:                       `{}`,
		`{"a":"usage","b":{"usage":1}}`:     `{"a":"usage","b":{"usage":1}}`,
		`{"usage":1,"a":2,"usage":3}`:       `{"a":2}`,
	} {
		got, _ := Without([]byte(in), "usage")
		if string(got) != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
	if _, ok := Without([]byte(`{"a":1}`), "usage"); ok {
		t.Error("no usage: nothing removed")
	}
}

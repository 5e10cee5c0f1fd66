package chat

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// reference decodes body as encoding/json does, for a body whose keys are
// all in lower case (encoding/json would also take a key in another case).
func reference(t *testing.T, body []byte) (*Request, bool) {
	t.Helper()
	var v any
	if json.Unmarshal(body, &v) != nil || !lowerKeys(v) {
		return nil, false
	}
	var r Request
	if json.Unmarshal(body, &r) != nil {
		return nil, false
	}
	return &r, true
}

func lowerKeys(v any) bool {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if k != strings.ToLower(k) || !lowerKeys(e) {
				return false
			}
		}
	case []any:
		for _, e := range v {
			if !lowerKeys(e) {
				return false
			}
		}
	}
	return true
}

func TestParseRequest(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi\nthere \"you\" \u00e9"}]}`,
		`{"model":"m","max_tokens":5,"max_completion_tokens":7,"temperature":0.5,"top_p":1,"stop":["a","b"],"user":"u",
		  "seed":3,"presence_penalty":0.1,"frequency_penalty":0.2,"stream":true,"stream_options":{"include_usage":true},
		  "response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object"}}},"parallel_tool_calls":false,
		  "tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"}}}],"tool_choice":"auto",
		  "messages":[{"role":"system","content":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}]},
		   {"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA==","detail":"low"}},
		     {"type":"image_url","image_url":"https://x/y.png"},{"type":"file","file":{"file_data":"data:application/pdf;base64,AA==","filename":"a.pdf"}}]},
		   {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},
		     {"id":"c2","type":"function","function":{"name":"g","arguments":{"b":2}}}]},
		   {"role":"tool","tool_call_id":"c1","content":"ok","name":"f"},null,{"role":"assistant","content":"","refusal":"no"}]}`,
		`{"messages":[],"model":null,"unknown":{"messages":[1]}}`,
	} {
		want, ok := reference(t, []byte(body))
		if !ok {
			t.Fatalf("bad case %s", body)
		}
		got, err := ParseRequest([]byte(body), "p")
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\nexpected %+v\ngot      %+v (%v)", body, want, got, err)
		}
	}
	for _, bad := range []string{`[]`, `"x"`, `{"messages":"x"}`, `{"messages":[1]}`, `{"messages":[{"role":5}]}`,
		`{"messages":[{"content":42}]}`, `{"messages":[{"tool_calls":{}}]}`, `{"n":2}`} {
		if r, err := ParseRequest([]byte(bad), "p"); err == nil {
			t.Errorf("%s: expected an error, got %+v", bad, r)
		}
	}
}

// FuzzParseRequest: the member scan reads what encoding/json reads.
func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a\"]}"}]},null],"n":1}`))
	f.Add([]byte(`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"tool","content":"x"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		want, ok := reference(t, body)
		if !ok {
			return
		}
		got, err := ParseRequest(body, "p")
		if err != nil {
			if want.N != nil && *want.N > 1 {
				return
			}
			t.Fatalf("%q: encoding/json reads it, the scan says %v", body, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\nencoding/json %+v\nscan          %+v", body, want, got)
		}
	})
}

func TestContent(t *testing.T) {
	for raw, want := range map[string]string{`"a\tb"`: "a\tb", `null`: "", `[{"type":"text","text":"x"},{"type":"image_url"},{"type":"text","text":"y"}]`: "x\ny"} {
		var c Content
		if err := json.Unmarshal([]byte(raw), &c); err != nil || c.String() != want {
			t.Errorf("%s: expected %q, got %q (%v)", raw, want, c.String(), err)
		}
		out, _ := json.Marshal(c)
		if !bytes.Equal(bytes.TrimSpace(out), []byte(raw)) && raw != `"a\tb"` {
			t.Errorf("%s: round trip gave %s", raw, out)
		}
	}
	if out, _ := json.Marshal(Message{Role: "assistant"}); string(out) != `{"role":"assistant","content":null}` {
		t.Errorf("expected null content, got %s", out)
	}
	if out, _ := json.Marshal(Text("")); string(out) != `""` {
		t.Errorf("expected an empty string, got %s", out)
	}
}

package redact

import "testing"

// A URL quoted as written keeps its placeholders and is masked even when
// it does not parse.
func TestURLAsWritten(t *testing.T) {
	for in, want := range map[string]string{
		"https://{env.HOST}/v1?api-key={env.KEY}": "https://{env.HOST}/v1?api-key=xxxxx",
		"https://u:sk-abc@gw example/v1":          "https://xxxxx@gw example/v1",
		"gw.example/v1?key=abc#f":                 "gw.example/v1?key=xxxxx#xxxxx",
		"{env.BASE}/v1":                           "{env.BASE}/v1",
	} {
		if got := URLAsWritten(in); got != want {
			t.Errorf("%s: expected %s, got %s", in, want, got)
		}
	}
}

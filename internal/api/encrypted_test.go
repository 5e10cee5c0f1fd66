package api

import (
	"net/http"
	"slices"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/jsontest"
)

// The encrypted items of a Responses request are read in order; a
// stripped body loses the items drop picks, the reasoning items left
// without encrypted_content and the other items' ids (but an
// item_reference's and a kept encrypted item's); nothing is stripped when
// drop picks none.
func TestStripEncrypted(t *testing.T) {
	body := []byte(`{"model":"m","input":[` +
		`{"type":"reasoning","id":"rs_1","encrypted_content":"gAAA-one","summary":[]},` +
		`{"type":"reasoning","id":"rs_2","summary":[]},` +
		`{"type":"function_call","id":"fc_1","call_id":"c1","name":"f","arguments":"{}"},` +
		`{"type":"item_reference","id":"msg_0"},` +
		`{"type":"reasoning","id":"rs_3","encrypted_content":"gAAA-two","summary":[]},` +
		`{"role":"user","content":"go on"}]}`)
	req, _, e := Responses{}.Parse(body, http.Header{})
	if e != nil {
		t.Fatal(e)
	}
	if got := EncryptedItems(req); !slices.Equal(got, []string{"gAAA-one", "gAAA-two"}) {
		t.Errorf("encrypted items %v", got)
	}
	out, stripped := StripEncrypted(body, func(enc string) bool { return enc == "gAAA-one" })
	want := `{"model":"m","input":[` +
		`{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},` +
		`{"type":"item_reference","id":"msg_0"},` +
		`{"type":"reasoning","id":"rs_3","encrypted_content":"gAAA-two","summary":[]},` +
		`{"role":"user","content":"go on"}]}`
	if !stripped {
		t.Fatal("expected the first item stripped")
	}
	if !jsontest.Same(t, out, want) {
		t.Errorf("stripped:\n%s\nwant\n%s", out, want)
	}
	if same, stripped := StripEncrypted(body, func(string) bool { return false }); stripped || string(same) != string(body) {
		t.Errorf("nothing to drop: stripped %v", stripped)
	}
}

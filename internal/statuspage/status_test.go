package statuspage

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

// The page is the embedded assets put together: the style and the script
// inline, whose hashes the CSP allows, and the refresh period in
// milliseconds; no placeholder is left.
func TestPageInlinesItsAssets(t *testing.T) {
	css, _ := os.ReadFile("assets/status.css")
	js, _ := os.ReadFile("assets/status.js")
	p := Page(1500 * time.Millisecond)
	if !bytes.Contains(p, []byte("<style>\n"+string(css)+"</style>")) || !bytes.Contains(p, []byte("<script>\n"+string(js)+"</script>")) {
		t.Errorf("expected the style and script inline")
	}
	if !bytes.Contains(p, []byte(`data-refresh-ms="1500"`)) || bytes.Contains(p, []byte("{{")) {
		t.Errorf("expected the refresh period and no placeholder left")
	}
	for _, text := range []string{"\n" + string(css), "\n" + string(js)} {
		if !strings.Contains(CSP, "'"+cspHash(text)+"'") {
			t.Errorf("expected the CSP to allow the inline text's hash")
		}
	}
	if !bytes.Contains(Page(0), []byte(`data-refresh-ms="0"`)) {
		t.Errorf("expected refresh 0 as 0")
	}
}

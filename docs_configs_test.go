package llmrouter

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	_ "github.com/caddyserver/caddy/v2/modules/standard" // basic_auth, redir, log...: the docs' configs use them
)

// siteOrOptions is the first line of a whole Caddyfile: the global
// options' "{" or a site block's addresses.
var siteOrOptions = regexp.MustCompile(`^(\{|(https?://\S+|[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+(:\d+)?|:\d+|localhost(:\d+)?)(,? \S+)* \{)$`)

// wholeConfigs returns the caddyfile code blocks of a Markdown text that
// are whole Caddyfiles (a reader copies them as they are), with the line
// each starts on; fragments (a directive alone) and sketches (a line "...")
// are not.
func wholeConfigs(text string) map[int]string {
	out := map[int]string{}
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != "```caddyfile" {
			continue
		}
		start := i + 1
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
		}
		block := lines[start:min(i, len(lines))]
		first, sketch := "", false
		for _, l := range block {
			t := strings.TrimSpace(l)
			sketch = sketch || t == "..."
			if first == "" && t != "" && !strings.HasPrefix(t, "#") {
				first = t
			}
		}
		if siteOrOptions.MatchString(first) && !sketch {
			out[start+1] = strings.Join(block, "\n") + "\n"
		}
	}
	return out
}

// TestDocConfigsAdaptWithoutWarnings: every whole Caddyfile that README.md
// and docs/ show, and Caddyfile.example, adapts with no error and no
// warning; Caddy warns at each start of an unformatted one ("Caddyfile
// input is not formatted; run 'caddy fmt --overwrite'"), so they are as
// caddy fmt writes them (one space before a line's comment).
func TestDocConfigsAdaptWithoutWarnings(t *testing.T) {
	configs := 0
	for _, file := range append(docFiles(t), "Caddyfile.example") {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		blocks := wholeConfigs(string(raw))
		if file == "Caddyfile.example" {
			blocks = map[int]string{1: string(raw)}
		}
		for line, body := range blocks {
			configs++
			_, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(body), map[string]any{"filename": file})
			if err != nil {
				t.Errorf("%s:%d: the config does not adapt: %v", file, line, err)
			}
			for _, w := range warnings {
				t.Errorf("%s:%d: adapting the config warns: %s (line %d of the block)", file, line, w.Message, w.Line)
			}
		}
	}
	if configs < 4 {
		t.Errorf("expected at least 4 whole configs (Caddyfile.example, README's, docs/consumers.md's, docs/security.md's), found %d", configs)
	}
}

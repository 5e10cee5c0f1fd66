package llmrouter

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	_ "github.com/llmrouter/caddy-llm-router/mockllm" // llm_mock's directive, documented in docs/reference.md
)

// The docs' test: the documentation holds no broken relative link, and
// docs/reference.md documents every subdirective of the Caddyfile.

// docFiles are the Markdown files whose links are checked: README.md, the
// other top-level pages (ARCHITECTURE.md, TESTING.md, BENCHMARKS.md), docs/
// and bench/README.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, pattern := range []string{"*.md", "docs/*.md", "bench/*.md"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if !slices.Contains(files, "README.md") || !slices.Contains(files, filepath.Join("docs", "reference.md")) {
		t.Fatalf("expected README.md and docs/reference.md among %v", files)
	}
	return files
}

// mdLink is a Markdown link or image, [text](target) or ![alt](target),
// with an optional "title" after the target.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

var (
	linkInHeading = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	scheme        = regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`) // https:, mailto:
)

// prose returns the lines of a Markdown file with fenced code blocks
// blanked out, and inline code spans within the others.
func prose(text string) []string {
	lines := strings.Split(text, "\n")
	fenced := false
	for i, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			lines[i] = ""
			continue
		}
		if fenced {
			lines[i] = ""
			continue
		}
		parts := strings.Split(line, "`")
		for j := 1; j < len(parts); j += 2 {
			parts[j] = ""
		}
		lines[i] = strings.Join(parts, "``")
	}
	return lines
}

// anchors returns the ids GitHub gives the headings of a Markdown file:
// the heading's text in lower case, without punctuation (letters, digits,
// spaces, '-' and '_' stay), spaces as '-'; a repeated id gets "-1", "-2"...
func anchors(text string) map[string]bool {
	ids, count := map[string]bool{}, map[string]int{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		title = linkInHeading.ReplaceAllString(title, "$1")
		id := strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				return unicode.ToLower(r)
			}
			return -1
		}, title)
		if n := count[id]; n > 0 {
			ids[id+"-"+strconv.Itoa(n)] = true
		} else {
			ids[id] = true
		}
		count[id]++
	}
	return ids
}

// TestDocLinks: every relative link of the docs names a file that exists
// and, when it has a #fragment into a Markdown file, one of its headings.
func TestDocLinks(t *testing.T) {
	read := func(path string) string {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	links := 0
	for _, file := range docFiles(t) {
		for i, line := range prose(read(file)) {
			n := i + 1
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if scheme.MatchString(target) {
					continue
				}
				links++
				path, fragment, _ := strings.Cut(target, "#")
				resolved := file
				if path != "" {
					resolved = filepath.Join(filepath.Dir(file), path)
				}
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s:%d: link %q: no file %s", file, n, target, resolved)
					continue
				}
				if fragment == "" || !strings.HasSuffix(resolved, ".md") {
					continue
				}
				if !anchors(read(resolved))[fragment] {
					t.Errorf("%s:%d: link %q: %s has no heading #%s", file, n, target, resolved, fragment)
				}
			}
		}
	}
	if links < 50 {
		t.Errorf("expected the docs to hold at least 50 relative links, found %d: is the link pattern wrong?", links)
	}
}

// adaptError adapts a Caddyfile and returns its error's text ("" if none).
func adaptError(caddyfile string) string {
	_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err == nil {
		return ""
	}
	return err.Error()
}

// probe is a Caddyfile with name alone, without arguments, in a block of
// llm_router (block is "llm_router", "provider", "model", "deployment" or
// "store"), for each provider type that may take it.
func probe(block, name string) []string {
	const provider = "provider p {\n type openai\n api_key none\n base_url http://127.0.0.1:1/v1\n}\n"
	site := func(inner string) string { return ":8080 {\n llm_router {\n" + inner + "\n }\n}\n" }
	switch block {
	case "llm_router":
		return []string{site(name + "\n" + provider + "model m {\n deployment p x\n}")}
	case "provider":
		var out []string
		for _, typ := range []string{"openai", "bedrock", "vertex"} { // the built-in types with options of their own
			out = append(out, site("provider p {\n type "+typ+"\n "+name+"\n}\nmodel m {\n deployment p x\n}"))
		}
		return out
	case "model":
		return []string{site(provider + "model m {\n " + name + "\n deployment p x\n}")}
	case "deployment":
		return []string{site(provider + "model m {\n deployment p x {\n " + name + "\n }\n}")}
	case "store":
		return []string{site("store redis redis://127.0.0.1:1 {\n " + name + "\n}\n" + provider + "model m {\n deployment p x\n}")}
	case "plan":
		return []string{site("plan t {\n " + name + "\n}\n" + provider + "model m {\n deployment p x\n}")}
	}
	panic("no block " + block)
}

// accepted reports whether the parser takes name as a subdirective of
// block: some probe's error is not "unknown subdirective" (it may be a
// missing argument: the probe gives none).
func accepted(block, name string) bool {
	for _, cf := range probe(block, name) {
		if !strings.Contains(adaptError(cf), "unknown subdirective") {
			return true
		}
	}
	return false
}

// syntaxBlock returns, from the first caddyfile code block of text whose
// first line starts with directive, each subdirective's name by the name
// of the block it is written in ("llm_router", "provider", ...).
func syntaxBlock(t *testing.T, text, directive string) map[string][]string {
	t.Helper()
	for _, block := range strings.Split(text, "```caddyfile\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		if !strings.HasPrefix(block, directive+" ") {
			continue
		}
		names, stack := map[string][]string{}, []string{}
		for _, line := range strings.Split(block, "\n") {
			line, _, _ = strings.Cut(line, "#")
			fields := strings.Fields(line)
			switch {
			case len(fields) == 0:
			case fields[0] == "}":
				stack = stack[:max(len(stack)-1, 0)]
			case len(stack) == 0:
				stack = append(stack, fields[0])
			default:
				names[stack[len(stack)-1]] = append(names[stack[len(stack)-1]], fields[0])
				if strings.HasSuffix(strings.TrimSpace(line), "{") {
					stack = append(stack, fields[0])
				}
			}
		}
		return names
	}
	t.Fatalf("no caddyfile block starting with %q", directive)
	return nil
}

// tableNames returns the first word of the first code span of each table
// row's first cell in text (here: the llm_router section of the reference) ("| `budget <USD> per <duration>` | ..." is
// budget).
func tableNames(text string) map[string]bool {
	names := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_0-9]+)[^`]*` \\|").FindAllStringSubmatch(text, -1) {
		names[m[1]] = true
	}
	return names
}

// builtInProviderKeys are what a provider block takes: providerKeys and
// the built-in types' own options (the tests register types of their own,
// which the reference does not document).
func builtInProviderKeys() []string {
	keys := slices.Clone(providerKeys)
	for _, o := range []ProviderOptions{&OpenAI{}, &Bedrock{}, &Vertex{}} {
		keys = append(keys, o.ProviderOptions()...)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// TestReferenceHasEveryDirective: docs/reference.md documents, in its
// syntax block and in its table of defaults, every subdirective of the
// llm_router Caddyfile, taken from the parser's own tables of names (the
// ones its "did you mean" suggestions come from: handlerKeys,
// anyProviderKeys, ...); each of those names is accepted by the parser
// where the table says, and each name the reference documents is one the
// parser accepts (a Caddyfile fed to the caddyfile adapter, so what is
// tested is what Caddy runs, not how caddyfile.go is written). The
// llm_router_status and llm_mock blocks documented there (llm_mock's
// rate_limit and fault blocks too) are checked against their parsers the
// same way.
func TestReferenceHasEveryDirective(t *testing.T) {
	raw, err := os.ReadFile("docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	ref := string(raw)
	section, _, _ := strings.Cut(ref, "\n## llm_router_status")
	documented, rows := syntaxBlock(t, ref, "llm_router"), tableNames(section)
	tables := map[string][]string{"llm_router": handlerKeys, "provider": builtInProviderKeys(), "model": modelKeys,
		"deployment": deploymentKeys, "store": storeKeys, "plan": planKeys}
	for block, names := range tables {
		if accepted(block, "zz_no_such_directive") {
			t.Fatalf("the probe of a %s block cannot tell an unknown subdirective: %q", block, adaptError(probe(block, "zz_no_such_directive")[0]))
		}
		for _, name := range names {
			if !accepted(block, name) {
				t.Errorf("%s is in the parser's table of %s subdirectives, but the parser refuses it: %s", name, block, adaptError(probe(block, name)[0]))
			}
			if !slices.Contains(documented[block], name) {
				t.Errorf("docs/reference.md: %s is a subdirective of %s, missing from the syntax block's %s block (it has %v)", name, block, block, documented[block])
			}
			if !rows[name] {
				t.Errorf("docs/reference.md: %s (%s) has no row in the table of defaults", name, block)
			}
		}
	}
	for block, names := range documented {
		if tables[block] == nil {
			t.Errorf("docs/reference.md documents a %s block in llm_router, which the parser's tables do not know", block)
			continue
		}
		for _, name := range names {
			if !slices.Contains(tables[block], name) {
				t.Errorf("docs/reference.md documents %s in a %s block, which the parser's table of %s subdirectives lacks", name, block, block)
			}
		}
	}
	for name := range rows {
		found := false
		for _, names := range tables {
			found = found || slices.Contains(names, name)
		}
		if !found && !accepted("llm_router", name) {
			t.Errorf("docs/reference.md's table has a row for %s, which no block of llm_router takes", name)
		}
	}
	documentedIn(t, "llm_router_status", syntaxBlock(t, ref, "llm_router_status")["llm_router_status"], 1,
		func(name string) string { return ":8080 {\n llm_router_status {\n " + name + "\n }\n}\n" })
	mock := syntaxBlock(t, ref, "llm_mock")
	documentedIn(t, "llm_mock", mock["llm_mock"], 10,
		func(name string) string { return ":8080 {\n llm_mock {\n " + name + "\n }\n}\n" })
	documentedIn(t, "llm_mock's rate_limit", mock["rate_limit"], 3,
		func(name string) string { return ":8080 {\n llm_mock {\n rate_limit {\n " + name + "\n }\n }\n}\n" })
	documentedIn(t, "llm_mock's fault", mock["fault"], 10,
		func(name string) string { return ":8080 {\n llm_mock {\n fault status {\n " + name + "\n }\n }\n}\n" })
}

// documentedIn checks that the parser of block takes each of names (at
// least that many, as documented) and refuses a name that is none:
// caddyfile(name) is a Caddyfile with name alone in that block.
func documentedIn(t *testing.T, block string, names []string, least int, caddyfile func(name string) string) {
	t.Helper()
	if len(names) < least {
		t.Fatalf("expected at least %d documented subdirectives of %s in docs/reference.md, got %v", least, block, names)
	}
	unknown := regexp.MustCompile(`unrecognized subdirective|unknown subdirective`)
	for _, name := range append(names, "zz_no_such_directive") {
		msg := adaptError(caddyfile(name))
		if refused := unknown.MatchString(msg); refused != (name == "zz_no_such_directive") {
			t.Errorf("%s %s: documented in docs/reference.md, the parser says %q", block, name, msg)
		}
	}
}

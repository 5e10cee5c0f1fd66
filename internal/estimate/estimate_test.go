package estimate

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func image(n int) string {
	return base64.StdEncoding.EncodeToString([]byte(strings.Repeat("\x89PNG\r\n\x1a\n\x00\x00", n/10)))
}

func TestPrompt(t *testing.T) {
	text := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("word ", 800) + `"}]}`
	if got, want := Prompt([]byte(text)), int64(len(text))/4+1; got != want {
		t.Errorf("text: expected bytes / 4 + 1 = %d, got %d", want, got)
	}
	for _, tc := range []struct{ name, body string }{
		{"chat data URL", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}}]}]}`},
		{"Messages source", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"%s"}},{"type":"text","text":"What is this?"}]}]}`},
		{"Gemini inline_data", `{"contents":[{"role":"user","parts":[{"inline_data":{"mime_type":"image/png","data":"%s"}},{"text":"What is this?"}]}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := image(750_000) // 1 MB of base64
			body := fmt.Sprintf(tc.body, img)
			got := Prompt([]byte(body))
			want := int64(len(body)-len(img))/4 + 1 + PayloadTokens
			if strings.HasPrefix(tc.name, "chat") {
				want = int64(len(body)-len(img)-len("data:image/png;base64,"))/4 + 1 + PayloadTokens
			}
			if got != want {
				t.Errorf("expected %d (the text, and %d for the image), got %d (bytes / 4 would be %d)", want, PayloadTokens, got, len(body)/4)
			}
			if two := Prompt([]byte(strings.Replace(body, "What is this?", "What is this? "+fmt.Sprintf(`","x":"%s`, img), 1))); two < got+PayloadTokens-10 || two > got+PayloadTokens+20 {
				t.Errorf("two images: expected about %d, got %d", got+PayloadTokens, two)
			}
		})
	}
	// A small image counts its bytes / 4, not a full image's tokens.
	small := image(800)
	body0 := `{"c":"data:image/png;base64,` + small + `"}`
	if got, want := Prompt([]byte(body0)), int64(len(body0))/4+2; got < want-2 || got > want+2 {
		t.Errorf("a small image: expected about %d, got %d", want, got)
	}
	// Base64 wrapped at 76 characters, as GNU base64 and MIME write it.
	img := image(100_000)
	var wrapped strings.Builder
	for i := 0; i < len(img); i += 76 {
		wrapped.WriteString(img[i:min(i+76, len(img))] + `\n`)
	}
	body := `{"messages":[{"content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + wrapped.String() + `"}}]}]}`
	if got := Prompt([]byte(body)); got > PayloadTokens+100 {
		t.Errorf("wrapped base64: expected about %d, got %d", PayloadTokens, got)
	}
	// Not payloads: long text with spaces, a long string with an escaped
	// quote in it, a short base64 run, a long URL, DNA, a hex dump.
	for _, s := range []string{
		strings.Repeat("ACGT", 2000),
		strings.Repeat("0123456789abcdef", 200),
		strings.Repeat("lorem ipsum ", 200),
		strings.Repeat("a", 600) + `\"` + strings.Repeat("b", 600),
		"aGVsbG8gd29ybGQ=",
		"https://example.com/" + strings.Repeat("x", 2000) + "?q=1",
	} {
		body := `{"messages":[{"content":"` + s + `"}]}`
		if got, want := Prompt([]byte(body)), int64(len(body))/4+1; got != want {
			t.Errorf("%.30q...: expected bytes / 4 + 1 = %d, got %d", s, want, got)
		}
	}
	// Broken JSON (a cut body) never panics and counts its bytes.
	for _, b := range []string{`{"a":"`, `"`, `{"a":"` + image(3000), `\`, ``} {
		if got := Prompt([]byte(b)); got < 1 {
			t.Errorf("%.20q: expected at least 1, got %d", b, got)
		}
	}
}

func TestExact(t *testing.T) {
	// o200k_base: "hello world" is 2 tokens; each " hello world" 2 more.
	text := `hello world` + strings.Repeat(" hello world", 99)
	body := []byte(`{"messages":[{"content":"` + text + `"}]}`)
	// The string values count, a line each: "messages" and "content" 1
	// token each, and 3 line breaks.
	if n, complete, ok := Exact(body, 1000); !ok || !complete || n != 205 {
		t.Errorf("expected 205 tokens, got %d (complete %v, ok %v)", n, complete, ok)
	}
	img := image(100_000)
	withImage := []byte(`{"messages":[{"content":"` + text + `","image":"` + img + `"}]}`)
	if n, _, _ := Exact(withImage, 10_000); n != 207+PayloadTokens {
		t.Errorf("expected 207 tokens of text (\"image\" and its line break too) and the image's %d, got %d", PayloadTokens, n)
	}
	// Escaped text counts as the text it escapes: Chinese as JSON's
	// \u escapes (Python's json.dumps) counts as the characters.
	zh := strings.Repeat("中文的文本", 200)
	escaped, _ := json.Marshal(map[string]string{"content": zh})
	asIs := []byte(`{"content":"` + zh + `"}`)
	ascii := []byte(strings.NewReplacer("中", `\u4e2d`, "文", `\u6587`, "的", `\u7684`, "本", `\u672c`).Replace(string(asIs)))
	a, _, _ := Exact(asIs, 100_000)
	b, _, _ := Exact(ascii, 100_000)
	c, _, _ := Exact(escaped, 100_000)
	if a != b || a != c || a > 1100 {
		t.Errorf("expected the same count for the text and its escapes, got %d, %d and %d", a, b, c)
	}
	// The count stops past its limit: bounded by the window, not the body.
	big := []byte(`{"content":"` + strings.Repeat("The quick brown fox jumps over the lazy dog. ", 100_000) + `"}`)
	if n, complete, _ := Exact(big, 5000); complete || n < 5000 || n > 5000+chunkBytes/2 {
		t.Errorf("expected the count to stop a chunk past 5000, got %d (complete %v)", n, complete)
	}
	// A body cut inside a string still counts what it has.
	if n, complete, _ := Exact([]byte(`{"content":"hello world hello world`), 100); !complete || n != 7 {
		t.Errorf("a cut body: expected 7 tokens, got %d", n)
	}
}

// Counts under way are bounded: when every slot is taken, Exact says so at
// once rather than queueing.
func TestExactSlots(t *testing.T) {
	for range cap(exactSlots) {
		exactSlots <- struct{}{}
	}
	_, _, ok := Exact([]byte(`{"a":"b"}`), 10)
	for range cap(exactSlots) {
		<-exactSlots
	}
	if ok {
		t.Error("expected no count while every slot is taken")
	}
	if _, _, ok := Exact([]byte(`{"a":"b"}`), 10); !ok {
		t.Error("expected a count once the slots are free")
	}
}

func FuzzPrompt(f *testing.F) {
	f.Add([]byte(`{"a":"` + image(2000) + `"}`))
	f.Add([]byte(`{"a":"data:image/png;base64,` + image(2000) + `","b":"\\"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n := Prompt(b); n < 1 || n > int64(len(b))/2+2 {
			t.Errorf("count %d out of range for %d bytes", n, len(b))
		}
		if n, _, ok := Exact(b, 1000); ok && n < 0 {
			t.Errorf("exact count %d", n)
		}
	})
}

// BenchmarkPrompt and BenchmarkExact: the cost of each count on a prompt
// of ~150k tokens (600 KB of text) and on a small chat request.
func BenchmarkPrompt(b *testing.B) {
	for _, size := range []int{1, 7500} {
		body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("The quick brown fox jumps over the lazy dog; ", 2*size) + `"}]}`)
		b.Run(fmt.Sprintf("%dKB", len(body)/1000), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				Prompt(body)
			}
		})
	}
}

func BenchmarkExact(b *testing.B) {
	for _, size := range []int{1, 7500} {
		body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("The quick brown fox jumps over the lazy dog; ", 2*size) + `"}]}`)
		Exact(body, 1<<40) // the tokenizer's tables, once
		b.Run(fmt.Sprintf("%dKB", len(body)/1000), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			var n int64
			for b.Loop() {
				n, _, _ = Exact(body, 1<<40)
			}
			b.ReportMetric(float64(n), "tokens")
		})
	}
}

func TestO200k(t *testing.T) {
	for model, want := range map[string]bool{
		"gpt-4o": true, "gpt-4o-mini-2024-07-18": true, "gpt-4.1-nano": true, "gpt-5": true, "gpt-5.1": true, "gpt-5-mini": true,
		"o1": true, "o3-mini": true, "o4-mini": true, "openai/gpt-oss-120b": true, "chatgpt-4o-latest": true, "GPT-4o": true,
		"gpt-4": false, "gpt-3.5-turbo": false, "gpt-4-turbo": false, "o1x": false, "claude-sonnet-4-5": false,
		"llama-3.1-8b-instant": false, "gemini-2.5-pro": false, "gpt-50": false,
	} {
		if got := O200k(model); got != want {
			t.Errorf("%s: expected %v, got %v", model, want, got)
		}
	}
}

package llmrouter

import "testing"

// A client's path goes under the provider's base path after the client's
// API root, found by the base path's last segment.
func TestPassPath(t *testing.T) {
	for _, c := range []struct{ base, path, want string }{
		{"/v1", "/v1/audio/speech", "/v1/audio/speech"},
		{"/api/v1", "/v1/audio/speech", "/api/v1/audio/speech"},
		{"/openai/v1", "/v1/files/file-1/content", "/openai/v1/files/file-1/content"},
		{"/v1beta", "/v1beta/files", "/v1beta/files"},
		{"/v1", "/proxy/v1/batches", "/v1/batches"},
		{"/v1", "/v10/x", "/v1/v10/x"},
		{"/v1", "/audio", "/v1/audio"},
		{"", "/v1/audio", "/v1/audio"},
	} {
		if got := passPath(c.base, c.path); got != c.want {
			t.Errorf("passPath(%q, %q): expected %q, got %q", c.base, c.path, c.want, got)
		}
	}
}

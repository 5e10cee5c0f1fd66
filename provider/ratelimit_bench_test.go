package provider

import (
	"testing"
	"time"
)

// The resets OpenAI states with every answer (x-ratelimit-reset-requests,
// -tokens: Go durations; PROVIDERS.md) and other providers' seconds.
func BenchmarkParseResetInstant(b *testing.B) {
	ref := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	for _, v := range []string{"6ms", "30ms", "6m0s", "20", "1755780030"} {
		b.Run(v, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ParseResetInstant(v, ref)
			}
		})
	}
}

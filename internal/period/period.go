// Package period says a budget's period as a config writes it: the
// shortest form of a time.Duration that time.ParseDuration and Caddy's
// duration parser read back, "24h" and "1h30m" where Go says "24h0m0s"
// and "1h30m0s".
package period

import (
	"strings"
	"time"
)

// String is d without Go's trailing zero units: 24h0m0s is "24h", 1h30m0s
// "1h30m", 2m0s "2m"; a duration with seconds (1h0m30s, 1.5s, 500ms) is
// Go's own form.
func String(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Window is the budget window of period per that holds now: its index
// (windows are aligned to the Unix epoch: a day's starts at 00:00 UTC)
// and when it ends. per must be positive.
func Window(now time.Time, per time.Duration) (index int64, end time.Time) {
	index = now.UnixNano() / int64(per)
	return index, time.Unix(0, (index+1)*int64(per))
}

package period

import (
	"testing"
	"time"
)

func TestStringIsTheShortForm(t *testing.T) {
	for d, want := range map[time.Duration]string{
		24 * time.Hour: "24h", time.Hour: "1h", 90 * time.Minute: "1h30m", 2 * time.Minute: "2m",
		time.Hour + 30*time.Second: "1h0m30s", 90 * time.Second: "1m30s", 1500 * time.Millisecond: "1.5s",
		500 * time.Millisecond: "500ms", 10 * time.Minute: "10m", 0: "0s", -time.Hour: "-1h",
	} {
		got := String(d)
		if got != want {
			t.Errorf("%s: expected %q, got %q", time.Duration(d), want, got)
		}
		if back, err := time.ParseDuration(got); err != nil || back != d {
			t.Errorf("%q does not read back as %s: %v %v", got, time.Duration(d), back, err)
		}
	}
}

// A day's budget window ends at midnight UTC, an hour's on the hour.
func TestWindowIsAlignedToTheEpoch(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 17, 0, 0, time.UTC)
	if _, end := Window(now, 24*time.Hour); !end.Equal(time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("a day's window at %v ends at %v, want midnight UTC", now, end)
	}
	i, end := Window(now, time.Hour)
	if !end.Equal(time.Date(2026, 12, 3, 11, 0, 0, 0, time.UTC)) || i != now.Unix()/3600 {
		t.Errorf("an hour's window at %v: index %d, end %v", now, i, end)
	}
}

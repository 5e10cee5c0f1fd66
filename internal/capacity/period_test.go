package capacity

import (
	"testing"
	"time"
)

// A reload that changes a budget's period (SetLimit) keeps what the
// current window spent: carried into the new period's window that holds
// now, either way, never forgiven; once the old window has ended, the
// new period starts afresh.
func TestABudgetPeriodChangeKeepsTheSpend(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC) // in the 24h and the 12h windows from 00:00
	for _, c := range []struct {
		name     string
		from, to time.Duration
		renews   time.Time
	}{
		{"24h to 12h", 24 * time.Hour, 12 * time.Hour, at.Add(2 * time.Hour)},
		{"12h to 24h", 12 * time.Hour, 24 * time.Hour, at.Add(14 * time.Hour)},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := NewSpending(SpendLimit{USD: 50, Period: c.from}, nil, "")
			if over, _ := s.Add(at, 50); !over {
				t.Fatal("50 of 50 spent: expected over")
			}
			s.SetLimit(SpendLimit{USD: 50, Period: c.to})
			if over, until := s.Over(at.Add(time.Minute)); !over || !until.Equal(c.renews) {
				t.Errorf("after the reload: expected over until %v, got %v until %v", c.renews, over, until)
			}
			if over, _ := s.Over(c.renews); over {
				t.Error("the new period's next window: still over")
			}
		})
	}
	s := NewSpending(SpendLimit{USD: 50, Period: time.Hour}, nil, "")
	s.Add(at, 50)
	s.SetLimit(SpendLimit{USD: 50, Period: 24 * time.Hour})
	if over, _ := s.Over(at.Add(90 * time.Minute)); over {
		t.Error("the old window had ended before the reload's first look: its spend counted in the new period")
	}
}

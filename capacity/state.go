package capacity

import (
	"sync"
	"time"
)

// window is a Window anchored to the clock: Reset is an instant.
type window struct {
	limit, remaining int64
	reset            time.Time
}

func (w *window) update(now time.Time, o Window) {
	if o.Limit >= 0 {
		w.limit = o.Limit
	}
	if o.Remaining >= 0 {
		w.remaining = o.Remaining
	}
	if o.Reset >= 0 {
		w.reset = now.Add(min(o.Reset, MaxCooldown))
	} else if o.Remaining >= 0 {
		// A remaining count without a reset is only good for this instant.
		w.reset = time.Time{}
	}
}

// current returns the remaining count that still holds at now, or Unknown
// once the window has refreshed (or was never stated).
func (w *window) current(now time.Time) int64 {
	if w.remaining < 0 || !w.reset.After(now) {
		return Unknown
	}
	return w.remaining
}

// State is what is known about one deployment: its rate-limit windows, its
// circuit (open until an instant, for a reason) and its failure streak. It is
// safe for concurrent use. A State outlives a config reload when kept in a
// caddy.UsagePool (it implements caddy.Destructor).
type State struct {
	mu                  sync.Mutex
	requests, tokens    window
	openUntil           time.Time
	openReason          Class
	consecutiveFailures int
	lastClass           Class
	lastAt              time.Time
	lastMessage         string
}

// NewState returns a State with nothing known.
func NewState() *State {
	return &State{
		requests: window{limit: Unknown, remaining: Unknown},
		tokens:   window{limit: Unknown, remaining: Unknown},
	}
}

// Destruct implements caddy.Destructor; a State holds no resources.
func (s *State) Destruct() error { return nil }

// Observe folds one attempt's outcome, seen at now, into the state and
// returns how long the deployment is now avoided (zero if usable at once).
func (s *State) Observe(now time.Time, o Observation, p Policy) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests.update(now, o.Requests)
	s.tokens.update(now, o.Tokens)
	s.lastClass, s.lastAt = o.Class, now
	if o.Class.Failure() {
		s.consecutiveFailures++
		s.lastMessage = o.Message
	} else if o.Class == OK {
		s.consecutiveFailures = 0
		// A success proves the circuit closed, whatever opened it.
		s.openUntil = time.Time{}
	}
	if !o.Class.Failure() {
		// Exhausted windows are read by AvailableAt; no circuit to open.
		return o.Cooldown(p, 0)
	}
	cool := o.Cooldown(p, s.consecutiveFailures)
	if until := now.Add(cool); cool > 0 && until.After(s.openUntil) {
		s.openUntil, s.openReason = until, o.Class
	}
	return cool
}

// AvailableAt returns when the deployment may next be tried by a request of
// about tokens tokens (prompt plus max_tokens), and why it waits: a time not
// after now means "at once". It waits for an open circuit, for an exhausted
// request window, and for a token window whose remaining count is smaller
// than the request.
func (s *State) AvailableAt(now time.Time, tokens int64) (time.Time, Class) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, why := now, OK
	if s.openUntil.After(at) {
		at, why = s.openUntil, s.openReason
	}
	if r := s.requests.current(now); r == 0 && s.requests.reset.After(at) {
		at, why = s.requests.reset, RateLimited
	}
	if r := s.tokens.current(now); r >= 0 && r < max(tokens, 1) && s.tokens.reset.After(at) {
		at, why = s.tokens.reset, RateLimited
	}
	return at, why
}

// Headroom returns the smaller of remaining/limit for requests and tokens, in
// 0..1, or Unknown (-1) when neither window is known now.
func (s *State) Headroom(now time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := float64(Unknown)
	for _, w := range [2]*window{&s.requests, &s.tokens} {
		r := w.current(now)
		if r < 0 || w.limit <= 0 {
			continue
		}
		f := min(float64(r)/float64(w.limit), 1)
		if h < 0 || f < h {
			h = f
		}
	}
	return h
}

// Snapshot is a copy of a State for display (admin API, logs, tests).
type Snapshot struct {
	OpenUntil           time.Time `json:"open_until,omitzero"`
	OpenReason          string    `json:"open_reason,omitempty"`
	LimitRequests       int64     `json:"limit_requests"`
	RemainingRequests   int64     `json:"remaining_requests"`
	ResetRequests       time.Time `json:"reset_requests,omitzero"`
	LimitTokens         int64     `json:"limit_tokens"`
	RemainingTokens     int64     `json:"remaining_tokens"`
	ResetTokens         time.Time `json:"reset_tokens,omitzero"`
	ConsecutiveFailures int       `json:"consecutive_failures"`
	LastClass           string    `json:"last_class,omitempty"`
	LastAt              time.Time `json:"last_at,omitzero"`
	LastMessage         string    `json:"last_message,omitempty"`
}

// Snapshot returns a copy of the state.
func (s *State) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := Snapshot{
		OpenUntil:           s.openUntil,
		LimitRequests:       s.requests.limit,
		RemainingRequests:   s.requests.remaining,
		ResetRequests:       s.requests.reset,
		LimitTokens:         s.tokens.limit,
		RemainingTokens:     s.tokens.remaining,
		ResetTokens:         s.tokens.reset,
		ConsecutiveFailures: s.consecutiveFailures,
		LastAt:              s.lastAt,
		LastMessage:         s.lastMessage,
	}
	if !s.openUntil.IsZero() {
		snap.OpenReason = s.openReason.String()
	}
	if !s.lastAt.IsZero() {
		snap.LastClass = s.lastClass.String()
	}
	return snap
}

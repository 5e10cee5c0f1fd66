package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Which deployment made each Responses API response, shared by the fleet:
// a continuation (previous_response_id) may reach any instance, and only
// the deployment that made the response can serve it. Keys:
// <prefix>resp:<hash of the response id>, holding "<deployment id>\n<its
// name>\n<its consumer's tag>" (the id empty for a response the router
// translated; the tag, which the caller makes, empty without consumers;
// a value of two lines, written before tags, has none), expiring with the
// provider's retention.

type ownerWrite struct {
	key, value string
	ttl        time.Duration
}

// maxOwnerWrites bounds the owners waiting for the writer; past it the
// oldest are dropped (the instance still remembers them itself).
const maxOwnerWrites = 10_000

func (s *Store) ownerKey(responseID string) string {
	sum := sha256.Sum256([]byte("llm_router response\x00" + responseID))
	return s.prefix + "resp:" + hex.EncodeToString(sum[:16])
}

// RememberOwner records, for ttl, that the response responseID was made by
// the deployment of identity (see DeploymentID; "" for a response no
// provider keeps) named name, for the consumer of tag (the caller's
// token of its consumer, one line, never a key; "" for none). It is
// written in the background: the request path does not wait for Redis.
func (s *Store) RememberOwner(responseID, identity, name, tag string, ttl time.Duration) {
	id := ""
	if identity != "" {
		id = DeploymentID(identity)
	}
	s.queueWrite(ownerWrite{key: s.ownerKey(responseID), value: id + "\n" + name + "\n" + tag, ttl: ttl})
}

// queueWrite hands w to the writer, which writes it with the owners.
func (s *Store) queueWrite(w ownerWrite) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if len(s.owners) >= maxOwnerWrites {
		s.owners = s.owners[1:]
	}
	s.owners = append(s.owners, w)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Owner returns the deployment id (see DeploymentID; "" for a response no
// provider keeps) and name of the deployment that made responseID, and
// its consumer's tag (RememberOwner), ok false when the fleet does not
// know it or cannot tell (Redis slow or down: bounded by
// Options.Timeout).
func (s *Store) Owner(responseID string) (deploymentID, name, tag string, ok bool) {
	if !s.available() {
		return "", "", "", false
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	key := s.ownerKey(responseID)
	v, err := s.client.Get(ctx, key).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return "", "", "", false
	case redis.HasErrorPrefix(err, "WRONGTYPE"):
		s.replaceMalformed(ctx, key, "a key of the wrong type")
		return "", "", "", false
	case err != nil:
		s.callFailed("owner", err, start)
		return "", "", "", false
	}
	s.answered()
	if deploymentID, name, ok = strings.Cut(v, "\n"); !ok {
		s.replaceMalformed(ctx, key, "an owner without its deployment")
	}
	name, tag, _ = strings.Cut(name, "\n")
	return deploymentID, name, tag, ok
}

// replaceMalformed logs once that key held what the router cannot have
// written (what) and deletes it, within ctx: the router's next write
// makes it again, and no read takes it for an outage.
func (s *Store) replaceMalformed(ctx context.Context, key, what string) {
	s.malformed(key, what)
	_ = s.client.Del(ctx, key).Err()
}

func (s *Store) takeOwners() []ownerWrite {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.owners
	s.owners = nil
	return o
}

// writeOwners writes the owners in one pipeline.
func (s *Store) writeOwners(ctx context.Context, owners []ownerWrite) error {
	if len(owners) == 0 {
		return nil
	}
	pipe := s.client.Pipeline()
	for _, o := range owners {
		pipe.Set(ctx, o.key, o.value, o.ttl)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// Background responses (the Responses API's background: true) whose usage
// the fleet has not counted yet: <prefix>bg:<hash of the response id>,
// holding the name of the model group that made it, until one instance
// takes it (ClaimPending) or it expires.

func (s *Store) pendingKey(responseID string) string {
	sum := sha256.Sum256([]byte("llm_router background\x00" + responseID))
	return s.prefix + "bg:" + hex.EncodeToString(sum[:16])
}

// MarkPending records, for ttl, that the usage of the background response
// responseID, made for the model group group, is still to be counted. It
// is written in the background, with the owners.
func (s *Store) MarkPending(responseID, group string, ttl time.Duration) {
	s.queueWrite(ownerWrite{key: s.pendingKey(responseID), value: group, ttl: ttl})
}

// ClaimPending takes the mark MarkPending left for responseID (Redis
// GETDEL): ok for the one caller in the fleet that takes it, which counts
// the usage, with the mark's group; err when Redis cannot tell (down,
// slower than Options.Timeout).
func (s *Store) ClaimPending(responseID string) (group string, ok bool, err error) {
	if !s.available() {
		return "", false, errors.New("fleet store unavailable")
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	key := s.pendingKey(responseID)
	group, err = s.client.GetDel(ctx, key).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return "", false, nil
	case redis.HasErrorPrefix(err, "WRONGTYPE"):
		s.replaceMalformed(ctx, key, "a key of the wrong type")
		return "", false, nil
	case err != nil:
		s.callFailed("pending", err, start)
		return "", false, err
	}
	return group, true, nil
}

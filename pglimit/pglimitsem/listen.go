package pglimitsem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/listen"
)

// A Release that frees a slot of a key with live places in the queue
// notifies the namespace's channel (pg_notify, in the release's own
// statement, so at its commit) with the key's tag. A Semaphore with
// Config.Listen hears the channel on one session of its own (the
// Invalidator's listener: a heartbeat every second, a reconnection after
// a pause of 50ms doubling to 5s) and wakes its callers of Wait for that
// key, as a Release in its own process does. Waiters keep polling every
// WaitPoll: a notification lost (the session gone, a LISTEN behind a
// transaction-pooling PgBouncer) costs at most WaitPoll.

const (
	// listenHeartbeat is how often the listening session proves it is
	// alive, as the Invalidator's by default: a session that died without
	// a word is replaced within about two.
	listenHeartbeat = time.Second
	// tagLen is the length of a key's tag, in hex digits (128 bits).
	tagLen = 32
)

// channelOf is the notification channel of a namespace in table (schema
// qualified, quoted): a plain identifier of 30 bytes, whatever the
// namespace's length (PostgreSQL's channel names end at 63).
func channelOf(table, namespace string) string {
	h := sha256.Sum256([]byte(table + "\x00" + namespace))
	return "pglimit_slots_" + hex.EncodeToString(h[:8])
}

// tagOf is a key's payload in its namespace's notifications: the first
// 128 bits of its SHA-256, in hex, as slots.release_notify computes it. A
// collision only wakes a waiter that then finds no slot.
func tagOf(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])[:tagLen]
}

// listener is the goroutine that keeps the listening session.
type listener struct {
	stop context.CancelFunc
	done chan struct{}
}

// startListening starts the listener, with the first caller of Wait of a
// semaphore with Config.Listen, until Close. Called with wakeMu held.
func (s *Semaphore) startListening() {
	if s.listen == nil || s.listener != nil || s.closed {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	l := &listener{stop: stop, done: make(chan struct{})}
	s.listener = l
	// Releases while no session listened went unheard: each time the
	// session starts listening, every waiter tries again.
	session := listen.New(s.listen, s.channel, listenHeartbeat, s.wokenTag, s.wakeAll)
	go func() {
		defer close(l.done)
		session.Run(ctx)
	}()
}

// Close stops the listening session of a semaphore with Config.Listen,
// and returns once its goroutine has ended and its connection is closed.
// Callers of Wait then poll only. It is safe to call more than once, and
// does nothing to a semaphore without Listen, or one that never waited.
func (s *Semaphore) Close() {
	s.wakeMu.Lock()
	s.closed = true
	l := s.listener
	s.listener = nil
	s.wakeMu.Unlock()
	if l != nil {
		l.stop()
		<-l.done
	}
}

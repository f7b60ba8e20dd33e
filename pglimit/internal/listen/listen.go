// Package listen keeps one session listening on a channel: it proves the
// session alive with a heartbeat, reconnects after any failure, and says
// until when what it heard can be trusted. The Invalidator and
// pglimitsem's Semaphore use it.
package listen

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// reconnect backoff bounds of the listening session.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// Listener listens on one channel on a session of its own.
type Listener struct {
	conn      *pgx.ConnConfig
	channel   string
	heartbeat time.Duration
	notify    func(payload string)
	listening func()

	// liveUntil is the local time, in ns since the epoch, until which
	// what the session heard may be trusted; 0 while not listening.
	liveUntil atomic.Int64
	first     chan struct{} // closed at the first LISTEN
	once      sync.Once
	lastErr   atomic.Pointer[error] // the session's last failure
}

// SessionConfig is a copy of conn for a listening session: a
// heartbeat's deadline must leave the session usable, which a deadline on
// the socket does and a cancel request might not (it might cancel the
// next statement).
func SessionConfig(conn *pgx.ConnConfig) *pgx.ConnConfig {
	c := conn.Copy()
	c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	return c
}

// New returns a listener on channel over sessions of conn, proved alive
// every heartbeat. notify gets each notification's payload; listening is
// called each time the session starts listening, since notifications sent
// while it was not were missed. Both run on Run's goroutine.
func New(conn *pgx.ConnConfig, channel string, heartbeat time.Duration, notify func(payload string), listening func()) *Listener {
	return &Listener{conn: conn, channel: channel, heartbeat: heartbeat, notify: notify, listening: listening, first: make(chan struct{})}
}

// Trusted reports whether, at now, the session listens and proved it
// within twice the heartbeat.
func (l *Listener) Trusted(now time.Time) bool { return now.UnixNano() < l.liveUntil.Load() }

// First returns a channel closed when the session first listens.
func (l *Listener) First() <-chan struct{} { return l.first }

// LastErr returns the session's last failure, or nil.
func (l *Listener) LastErr() error {
	if p := l.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Run keeps the session listening until ctx ends: it connects, listens,
// proves the session alive every heartbeat, and reconnects with a backoff
// after any failure.
func (l *Listener) Run(ctx context.Context) {
	backoff := minBackoff
	for {
		listened := l.session(ctx)
		l.liveUntil.Store(0)
		if listened {
			backoff = minBackoff
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// session connects, listens and hands on notifications until the session
// fails or ctx ends; it reports whether it got as far as listening.
func (l *Listener) session(ctx context.Context) (listened bool) {
	cctx, cancel := context.WithTimeout(ctx, 2*l.heartbeat)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, l.conn)
	if err != nil {
		l.lastErr.Store(&err)
		return false
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), l.heartbeat)
		defer cancel()
		conn.Close(closeCtx)
	}()
	sent := time.Now()
	if _, err := conn.Exec(cctx, queries.Text("invalidator.listen", queries.Args{"channel": l.channel})); err != nil {
		l.lastErr.Store(&err)
		return false
	}
	// Notifications sent before LISTEN were not heard: start afresh.
	l.listening()
	l.liveUntil.Store(sent.Add(2 * l.heartbeat).UnixNano())
	l.once.Do(func() { close(l.first) })
	next := time.Now().Add(l.heartbeat)
	for {
		wctx, cancel := context.WithDeadline(ctx, next)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			l.notify(n.Payload)
			continue
		case ctx.Err() != nil:
			return true
		case wctx.Err() == nil:
			return true // the session failed
		}
		sent := time.Now()
		hctx, cancel := context.WithTimeout(ctx, l.heartbeat)
		err = conn.Ping(hctx)
		cancel()
		if err != nil {
			return true
		}
		l.liveUntil.Store(sent.Add(2 * l.heartbeat).UnixNano())
		next = time.Now().Add(l.heartbeat)
	}
}

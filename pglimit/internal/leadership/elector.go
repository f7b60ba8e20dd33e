package leadership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit/internal/queries"
	"github.com/pglimit/cooldown/pglimit/internal/service"
)

// ErrNotLeader is returned by [Elector.IsLeader] and [Elector.Do] while this
// process does not hold the lock.
var ErrNotLeader = errors.New("not the leader")

// Config configures an [Elector]. Every field is required.
type Config struct {
	// Acquire returns a connection the elector owns from then on: it closes
	// it when it dies or at Stop. Usually a hijacked pool connection.
	Acquire func(ctx context.Context) (*pgx.Conn, error)

	// Key is the advisory lock every contender asks for.
	Key int64

	// Interval is E in the package documentation: how often the elector
	// pings as leader or asks for the lock as follower.
	Interval time.Duration

	// Logger receives leadership changes and connection failures.
	Logger *slog.Logger

	// Role names the leader's work in log lines ("cleanup" if empty).
	Role string

	// OnChange, if not nil, is called with the new state whenever
	// leadership is gained or lost, from the elector's goroutine or from
	// Do. It must not call the elector.
	OnChange func(leader bool)
}

const (
	// stepTimeout bounds one step's round trips, so a connection that went
	// silent is given up rather than waited on.
	stepTimeout = 5 * time.Second

	// minIdleTimeout keeps idle_session_timeout clear of scheduling hiccups
	// when the interval is very short (tests).
	minIdleTimeout = 5 * time.Second

	// clientCheckInterval is how soon the server notices that the client
	// of a running statement has gone.
	clientCheckInterval = "1s"

	reasonStopped = "stopped"
)

// Elector takes part in the election for one key. Create it with [New], run
// it with [Elector.Start] and end it with [Elector.Stop].
type Elector struct {
	cfg    Config
	leader atomic.Bool

	// sem is a lock of one, held while conn is in use. Not a sync.Mutex:
	// waiting for it must end with the waiter's ctx, or a batch could wait
	// out a ping stuck on a stalled connection, and Stop with it.
	sem     chan struct{}
	conn    *pgx.Conn // nil while lost
	stopped bool
	lastErr string // the last failure logged, so a long outage logs once

	svc service.Service // the election loop; Stop cancels it at once
}

// New returns an elector that has not started.
func New(cfg Config) *Elector {
	return &Elector{cfg: cfg, sem: make(chan struct{}, 1)}
}

// lock takes sem, unless ctx ends first.
func (e *Elector) lock(ctx context.Context) error {
	select {
	case e.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (e *Elector) unlock() { <-e.sem }

// IdleTimeout is the idle_session_timeout the elector sets on its session
// for an election interval of interval.
func IdleTimeout(interval time.Duration) time.Duration {
	return max(4*interval, minIdleTimeout)
}

// Start starts the election loop. Its first step runs at once.
func (e *Elector) Start() {
	_ = e.svc.Start(e.loop) // a second Start does nothing
}

// Stop ends the loop and closes the connection, which releases the lock if
// held. ctx bounds saying goodbye to the server; the connection is closed
// either way. Stop must not be called while a Do is running.
func (e *Elector) Stop(ctx context.Context) {
	// The loop's ctx is cancelled at once, and its queries with it, so it
	// returns promptly.
	if started, _ := e.svc.Stop(ctx, nil); !started {
		return
	}

	// No Do runs and the loop has ended: free at once.
	e.sem <- struct{}{}
	defer e.unlock()
	if e.stopped {
		return
	}
	e.stopped = true
	if e.conn != nil {
		_ = e.conn.Close(ctx)
		e.conn = nil
	}
	e.setLeader(false, reasonStopped)
}

// IsLeader returns nil while this process holds the lock, else
// ErrNotLeader. It implements gocron's Elector and does no I/O: the loop
// keeps the state current, and work done through Do finds out for itself
// when the connection has died.
func (e *Elector) IsLeader(context.Context) error {
	if e.leader.Load() {
		return nil
	}
	return ErrNotLeader
}

// Leader reports whether this process holds the lock.
func (e *Elector) Leader() bool {
	return e.leader.Load()
}

// Do runs fn on the connection that holds the lock, so that fn's
// statements execute only in the leader's session; it returns ErrNotLeader
// without calling fn when this process is not the leader. If the
// connection is closed afterwards, leadership is lost. Waiting for the
// connection, which the election may be using, ends with ctx.
func (e *Elector) Do(ctx context.Context, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	if err := e.lock(ctx); err != nil {
		return err
	}
	defer e.unlock()
	if e.stopped || e.conn == nil || !e.leader.Load() {
		return ErrNotLeader
	}
	err := fn(ctx, e.conn)
	if e.conn.IsClosed() {
		e.drop(err)
	}
	return err
}

func (e *Elector) loop(ctx context.Context) {
	ticker := time.NewTicker(e.cfg.Interval)
	defer ticker.Stop()
	for {
		e.step(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// step moves the state machine once: a leader checks its connection; a
// lost elector dials; a follower asks for the lock.
func (e *Elector) step(loopCtx context.Context) {
	if e.lock(loopCtx) != nil {
		return // stopped
	}
	defer e.unlock()
	ctx, cancel := context.WithTimeout(loopCtx, stepTimeout)
	defer cancel()
	if e.stopped {
		return
	}
	defer func() {
		// A failure because Stop cancelled the step is no failure; Stop
		// closes the connection.
		if loopCtx.Err() == nil && e.conn != nil && e.conn.IsClosed() {
			e.drop(nil)
		}
	}()

	if e.conn != nil && e.leader.Load() {
		err := e.conn.Ping(ctx)
		if err == nil {
			return
		}
		e.drop(err)
	}
	if e.conn != nil && e.conn.IsClosed() {
		e.drop(nil)
	}
	if e.conn == nil {
		conn, err := e.dial(ctx)
		if err != nil {
			if loopCtx.Err() == nil {
				e.logFailure("dial", err)
			}
			return
		}
		e.conn = conn
	}

	// Only asked while not leader on this session: the lock is re-entrant,
	// and a second grant would need a second unlock.
	var got bool
	if err := e.conn.QueryRow(ctx, queries.Static("advisory.try_lock"), e.cfg.Key).Scan(&got); err != nil {
		if loopCtx.Err() == nil {
			e.logFailure("try lock", err)
		}
		return
	}
	e.lastErr = ""
	if got {
		e.setLeader(true, "acquired the lock")
	}
}

// dial gets a connection and makes the server end the session, releasing
// the lock, when the elector is gone: idle_session_timeout ends a session
// idle for longer than a live elector ever is (a leader that hung or whose
// host vanished), and client_connection_check_interval aborts a statement
// whose client has closed the connection (a leader that died during a
// batch) instead of letting it run on, holding the lock.
func (e *Elector) dial(ctx context.Context) (*pgx.Conn, error) {
	conn, err := e.cfg.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	idle := fmt.Sprintf("%dms", IdleTimeout(e.cfg.Interval).Milliseconds())
	if _, err := conn.Exec(ctx, queries.Static("leadership.session"), idle, clientCheckInterval); err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	return conn, nil
}

// drop closes a connection found dead (or failing) and loses leadership;
// a follower's failure is logged by the caller. Caller holds sem.
func (e *Elector) drop(cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = e.conn.Close(ctx)
	e.conn = nil
	reason := "connection closed"
	switch {
	case errors.Is(cause, context.Canceled):
		reason = reasonStopped // only Stop cancels
	case cause != nil:
		reason = cause.Error()
	}
	e.setLeader(false, reason)
}

// setLeader records the state, logging and reporting a change. Caller
// holds sem.
func (e *Elector) setLeader(leader bool, reason string) {
	if e.leader.Swap(leader) == leader {
		return
	}
	switch {
	case leader:
		e.cfg.Logger.Info("pglimit: "+e.role()+" leadership acquired", "lock_key", e.cfg.Key)
	case reason == reasonStopped:
		e.cfg.Logger.Info("pglimit: "+e.role()+" leadership released", "lock_key", e.cfg.Key)
	default:
		e.cfg.Logger.Warn("pglimit: "+e.role()+" leadership lost", "lock_key", e.cfg.Key, "reason", reason)
	}
	if e.cfg.OnChange != nil {
		e.cfg.OnChange(leader)
	}
}

// logFailure logs a failure unless it repeats the previous one, so a
// database outage does not log every interval. Caller holds sem.
func (e *Elector) logFailure(what string, err error) {
	msg := what + ": " + err.Error()
	if msg == e.lastErr {
		return
	}
	e.lastErr = msg
	e.cfg.Logger.Warn("pglimit: "+e.role()+" election: "+what+" failed", "lock_key", e.cfg.Key, "err", err)
}

// role is Config.Role, or "cleanup".
func (e *Elector) role() string {
	if e.cfg.Role == "" {
		return "cleanup"
	}
	return e.cfg.Role
}

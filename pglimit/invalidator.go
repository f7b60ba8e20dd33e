package pglimit

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"weak"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit/internal/engine"
	"github.com/pglimit/cooldown/pglimit/internal/listen"
	"github.com/pglimit/cooldown/pglimit/internal/service"
)

// InvalidatorConfig configures an [Invalidator].
type InvalidatorConfig struct {
	// ConnConfig is how to open the listening session: a direct
	// connection to the database the limiters use (LISTEN needs a session,
	// which PgBouncer's transaction pooling does not give). Required; the
	// Invalidator uses a copy.
	ConnConfig *pgx.ConnConfig

	// Heartbeat is how often the listening session proves it is alive.
	// Pre-blocks trust their entries for at most twice Heartbeat after the
	// last proof, so a Reset whose notification is lost (the session died
	// without a word) stops being ignored at most 2 × Heartbeat after it.
	// Defaults to 1s.
	Heartbeat time.Duration
}

const defaultHeartbeat = time.Second

// Invalidator carries every Reset, made by any instance, to the pre-blocks
// and leases of the limiters of this process that use it
// ([Config.Invalidator]): each Reset notifies, and the Invalidator listens
// on one dedicated session and forgets the key in every pre-block and lease
// of its table and namespace, within milliseconds of the Reset's commit.
//
// While the session is down or silent (before its first LISTEN, after a
// failed heartbeat, while it reconnects) the pre-blocks answer nothing, so
// every decision goes to the database; they, and the leases, start afresh,
// empty, once it listens again. A lease is not stopped while the session
// is down: a Reset then reaches it as it would without an Invalidator
// (docs/limits.md). One Invalidator serves any number of limiters. Stop it
// when done: it runs one goroutine and holds one connection.
type Invalidator struct {
	listener *listen.Listener
	svc      service.Service // the listener's loop; Stop cancels it at once

	mu   sync.Mutex
	subs map[int32][]func() forgetter // by lock class; each returns nil once its limiter is gone
}

// NewInvalidator returns an invalidator of cfg. It does no I/O; call
// [Invalidator.Start] to begin.
func NewInvalidator(cfg *InvalidatorConfig) (*Invalidator, error) {
	if cfg == nil || cfg.ConnConfig == nil {
		return nil, fmt.Errorf("%w: InvalidatorConfig.ConnConfig is required", ErrInvalidConfig)
	}
	if cfg.Heartbeat < 0 {
		return nil, fmt.Errorf("%w: Heartbeat must not be negative, got %s", ErrInvalidConfig, cfg.Heartbeat)
	}
	conn := listen.SessionConfig(cfg.ConnConfig)
	v := &Invalidator{subs: make(map[int32][]func() forgetter)}
	// Resets committed before a LISTEN were not heard: each (re)start
	// empties the pre-blocks and leases.
	v.listener = listen.New(conn, engine.ResetChannel, cmp.Or(cfg.Heartbeat, defaultHeartbeat), v.dispatch, v.clearAll)
	return v, nil
}

// Start starts the goroutine that connects, listens and reconnects, and
// returns once the session listens. If ctx ends first, nothing of the
// invalidator is left running, and the error wraps ctx's and names the
// session's last failure. An invalidator starts at most once.
func (v *Invalidator) Start(ctx context.Context) error {
	if err := v.svc.Start(v.listener.Run); err != nil {
		return fmt.Errorf("pglimit: invalidator: %w", err)
	}
	select {
	case <-v.listener.First():
		return nil
	case <-ctx.Done():
		_, _ = v.svc.Stop(context.Background(), nil)
		err := fmt.Errorf("pglimit: invalidator: not listening: %w", context.Cause(ctx))
		if last := v.listener.LastErr(); last != nil {
			err = fmt.Errorf("%w (last failure: %w)", err, last)
		}
		return err
	}
}

// Stop cancels the session's work, closes it, and returns once the
// goroutine has ended, within a heartbeat. The pre-blocks that used it
// answer nothing from then on. Stop on an invalidator not started, or
// stopped already, does nothing. It has the signature of every Stop in the
// library ([Cleaner.Stop]); the Invalidator's own needs no ctx, and never
// fails.
func (v *Invalidator) Stop(ctx context.Context) error {
	_, err := v.svc.Stop(ctx, nil)
	return err
}

// Listening reports whether the pre-blocks trust their entries now: the
// session listens and proved it within 2 × Heartbeat.
func (v *Invalidator) Listening() bool { return v.trusted(time.Now()) }

func (v *Invalidator) trusted(now time.Time) bool { return v.listener.Trusted(now) }

// forgetter is what follows Resets: a pre-block, a batcher's leases.
type forgetter interface {
	Forget(key string) // a Reset of key
	Clear()            // Resets may have been missed
}

// register makes f follow the Resets of lock class class, for as long as
// f is reachable from elsewhere.
func register[T any, F interface {
	*T
	forgetter
}](v *Invalidator, class int32, f F) {
	w := weak.Make((*T)(f))
	get := func() forgetter {
		if p := w.Value(); p != nil {
			return F(p)
		}
		return nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.subs[class] = append(v.subs[class], get)
}

// dispatch forgets the key of a notification in its class's pre-blocks,
// and drops the pre-blocks of limiters that are gone.
func (v *Invalidator) dispatch(payload string) {
	c, key, ok := strings.Cut(payload, ":")
	class, err := strconv.ParseInt(c, 10, 32)
	if !ok || err != nil {
		return // not a Reset's: someone else's NOTIFY on the channel
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	subs := v.subs[int32(class)]
	live := subs[:0]
	for _, get := range subs {
		if f := get(); f != nil {
			f.Forget(key)
			live = append(live, get)
		}
	}
	clear(subs[len(live):])
	v.subs[int32(class)] = live
}

// clearAll empties every pre-block that uses v.
func (v *Invalidator) clearAll() {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, subs := range v.subs {
		for _, get := range subs {
			if f := get(); f != nil {
				f.Clear()
			}
		}
	}
}

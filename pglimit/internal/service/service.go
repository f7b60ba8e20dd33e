// Package service gives everything the library runs in the background one
// lifecycle. A [Service] (the Cleaner, the Invalidator, the cleaners'
// leader election) is a loop on one goroutine, started at most once, and
// stopped at most once, with nothing of it left running when Stop returns.
// [Jobs] (a lease's give-back) are one-shot work, each bounded by a
// timeout, their failures counted.
package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ErrStarted reports a Start on a service started before, or stopped.
var ErrStarted = errors.New("started twice, or after Stop")

// Service runs its loop on one goroutine from Start to Stop. The zero
// Service is ready to start.
type Service struct {
	// Graceful lets the loop finish what it is doing once Stop begins: the
	// loop watches Stopping, and its ctx is cancelled only when Stop's own
	// ctx ends first. Otherwise Stop cancels the loop's ctx at once.
	Graceful bool

	mu       sync.Mutex
	state    state
	stopping chan struct{} // closed when Stop begins
	cancel   context.CancelFunc
	done     chan struct{} // closed when the loop has returned
}

type state int

const (
	fresh state = iota
	running
	stopped
)

// init makes the channels on first use, under mu.
func (s *Service) init() {
	if s.stopping == nil {
		s.stopping = make(chan struct{})
		s.done = make(chan struct{})
	}
}

// Start runs loop on a goroutine of its own. loop's ctx is cancelled by
// Stop: at once, or, for a Graceful service, when Stop's ctx ends first.
func (s *Service) Start(loop func(ctx context.Context)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != fresh {
		return ErrStarted
	}
	s.init()
	s.state = running
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.done)
		loop(ctx)
	}()
	return nil
}

// Stopping returns a channel closed when Stop begins.
func (s *Service) Stopping() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init()
	return s.stopping
}

// Stop stops the loop and returns once it has returned; between the two
// it runs then, if not nil (what must stop before the loop is waited for).
// A loop that is not Graceful has its ctx cancelled at once, and Stop
// waits for it without an error. If ctx ends before a Graceful loop
// returns, the loop's ctx is cancelled and Stop returns an error wrapping
// ctx's cause once the loop has returned. It reports whether the service
// was running: Stop on a service never started, or stopped already, does
// nothing.
func (s *Service) Stop(ctx context.Context, then func()) (bool, error) {
	s.mu.Lock()
	was := s.state
	s.state = stopped
	s.init()
	if was == running {
		close(s.stopping)
	}
	s.mu.Unlock()
	if was != running {
		return false, nil
	}
	if !s.Graceful {
		s.cancel()
		if then != nil {
			then()
		}
		<-s.done // its ctx has ended: the loop returns promptly
		return true, nil
	}
	if then != nil {
		then()
	}
	var err error
	select {
	case <-s.done:
	case <-ctx.Done():
		s.cancel()
		<-s.done
		err = fmt.Errorf("stopped before the loop was done: %w", context.Cause(ctx))
	}
	s.cancel()
	return true, err
}

// Jobs runs one-shot background work, such as a lease's give-back, each
// job bounded by Timeout, and counts the jobs that fail. The zero Jobs
// bounds nothing; set Timeout.
type Jobs struct {
	Timeout time.Duration
	Cause   error // the cause of a job's context past Timeout

	failures atomic.Int64
}

// Do runs job with a context that ends after Timeout, with Cause, and
// returns its error, counting it as a failure if it is not nil.
func (j *Jobs) Do(job func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeoutCause(context.Background(), j.Timeout, j.Cause)
	defer cancel()
	err := job(ctx)
	if err != nil {
		if cause := context.Cause(ctx); j.Cause != nil && errors.Is(cause, j.Cause) && !errors.Is(err, j.Cause) {
			err = fmt.Errorf("%w: %w", j.Cause, err)
		}
		j.failures.Add(1)
	}
	return err
}

// Failures is how many jobs have failed.
func (j *Jobs) Failures() int64 { return j.failures.Load() }

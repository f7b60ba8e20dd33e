package service

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// A service starts once, and its loop has returned when Stop returns.
func TestStartStop(t *testing.T) {
	var s Service
	var running atomic.Bool
	err := s.Start(func(ctx context.Context) {
		running.Store(true)
		<-ctx.Done()
		running.Store(false)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(func(context.Context) {}); !errors.Is(err, ErrStarted) {
		t.Fatalf("second Start: %v, want ErrStarted", err)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel() // a loop cancelled at once is waited for, whatever Stop's ctx
	was, err := s.Stop(ended, nil)
	if !was || err != nil {
		t.Fatalf("Stop: %t, %v; want true, nil", was, err)
	}
	if running.Load() {
		t.Fatal("the loop still runs after Stop")
	}
	if was, err := s.Stop(context.Background(), nil); was || err != nil {
		t.Fatalf("second Stop: %t, %v; want false, nil", was, err)
	}
	if err := s.Start(func(context.Context) {}); !errors.Is(err, ErrStarted) {
		t.Fatalf("Start after Stop: %v, want ErrStarted", err)
	}
}

// Stop on a service never started does nothing, and it cannot start after.
func TestStopBeforeStart(t *testing.T) {
	var s Service
	if was, err := s.Stop(context.Background(), nil); was || err != nil {
		t.Fatalf("Stop: %t, %v; want false, nil", was, err)
	}
	if err := s.Start(func(context.Context) {}); !errors.Is(err, ErrStarted) {
		t.Fatalf("Start after Stop: %v, want ErrStarted", err)
	}
}

// A graceful loop finishes its work when Stop begins, unless Stop's ctx
// ends first: then its ctx is cancelled, and Stop says so.
func TestGraceful(t *testing.T) {
	for _, tc := range []struct {
		name    string
		work    time.Duration // what the loop still does once stopping is closed
		grace   time.Duration
		wantErr bool
	}{
		{"finishes", 10 * time.Millisecond, time.Minute, false},
		{"cut short", time.Minute, 20 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Service{Graceful: true}
			var finished, cancelled atomic.Bool
			stopping := s.Stopping()
			err := s.Start(func(ctx context.Context) {
				<-stopping
				select {
				case <-time.After(tc.work):
					finished.Store(true)
				case <-ctx.Done():
					cancelled.Store(true)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), tc.grace)
			defer cancel()
			var then bool
			_, err = s.Stop(ctx, func() { then = true })
			if (err != nil) != tc.wantErr || !errors.Is(err, context.DeadlineExceeded) && tc.wantErr {
				t.Fatalf("Stop: %v, want an error %t", err, tc.wantErr)
			}
			if !then {
				t.Error("Stop did not run then")
			}
			if finished.Load() == tc.wantErr || cancelled.Load() != tc.wantErr {
				t.Errorf("finished %t, cancelled %t", finished.Load(), cancelled.Load())
			}
		})
	}
}

// A job's context ends after Timeout with Cause, its error then wraps
// Cause, and every failed job is counted.
func TestJobs(t *testing.T) {
	errLate := errors.New("late")
	j := Jobs{Timeout: 20 * time.Millisecond, Cause: errLate}
	if err := j.Do(func(context.Context) error { return nil }); err != nil || j.Failures() != 0 {
		t.Fatalf("a job that succeeds: %v, %d failures", err, j.Failures())
	}
	err := j.Do(func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, errLate) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a job past its timeout: %v, want it to wrap the cause and the deadline", err)
	}
	boom := errors.New("boom")
	if err := j.Do(func(context.Context) error { return boom }); err != boom {
		t.Fatalf("a job that fails at once: %v, want its own error alone", err)
	}
	if j.Failures() != 2 {
		t.Fatalf("%d failures counted, want 2", j.Failures())
	}
}

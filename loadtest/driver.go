package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// maxInFlight bounds the open-loop load's concurrent requests per instance.
// An arrival that finds that many still waiting is dropped and counted: the
// target stopped answering, and piling up more would only measure the load
// generator.
const maxInFlight = 2000

// closedLoop runs workers that each send a request, wait for its answer and
// send the next, until duration has passed; a request in flight then is
// allowed to finish. Worker w uses instance w mod len(decide). Cancelling
// ctx stops everything at once.
func closedLoop(ctx context.Context, decide []decideFunc, workers int, duration time.Duration, key func(*rand.Rand) string, rec *recorder) {
	var wg sync.WaitGroup
	for w := range workers {
		d := decide[w%len(decide)]
		rng := rand.New(rand.NewPCG(uint64(rec.start.UnixNano()), uint64(w)))
		wg.Go(func() {
			for time.Since(rec.start) < duration && ctx.Err() == nil {
				k := key(rng)
				sent := time.Now()
				o := d(ctx, k)
				rec.record(k, sent, time.Now(), o)
			}
		})
	}
	wg.Wait()
}

// openLoop sends, on every instance, one request for key at each offset of
// schedule from the start, whether or not earlier ones were answered: the
// arrival rate is the load's, not the target's. It returns the arrivals
// dropped because maxInFlight requests were still waiting.
func openLoop(ctx context.Context, decide []decideFunc, schedule []time.Duration, key string, rec *recorder) int64 {
	var (
		wg      sync.WaitGroup
		dropped atomic.Int64
	)
	for _, d := range decide {
		wg.Go(func() {
			var inFlight atomic.Int64
			var reqs sync.WaitGroup
			defer reqs.Wait()
			for _, at := range schedule {
				sent := rec.start.Add(at)
				if sleep(ctx, time.Until(sent)) != nil {
					return
				}
				if inFlight.Load() >= maxInFlight {
					dropped.Add(1)
					continue
				}
				inFlight.Add(1)
				reqs.Go(func() {
					defer inFlight.Add(-1)
					o := d(ctx, key)
					rec.record(key, sent, time.Now(), o)
				})
			}
		})
	}
	wg.Wait()
	return dropped.Load()
}

// phase is a stretch of the open-loop load whose arrival rate per instance
// goes linearly from From to To requests per second.
type phase struct {
	Duration time.Duration
	From, To float64
}

// arrivals returns evenly paced arrival offsets for phases: the k-th
// request (from 0) arrives when the integral of the rate reaches k.
func arrivals(phases []phase) []time.Duration {
	var (
		out   []time.Duration
		start time.Duration // of the current phase
		owed  float64       // requests due before the current phase
	)
	k := 0
	for _, p := range phases {
		T := p.Duration.Seconds()
		slope := (p.To - p.From) / T
		total := p.From*T + slope*T*T/2
		for ; float64(k) < owed+total; k++ {
			n := float64(k) - owed
			var t float64
			if slope == 0 {
				t = n / p.From
			} else {
				t = (-p.From + math.Sqrt(p.From*p.From+2*slope*n)) / slope
			}
			out = append(out, start+time.Duration(t*float64(time.Second)))
		}
		owed += total
		start += p.Duration
	}
	return out
}

// progress prints a status line to w once a second until stop is called.
func progress(w io.Writer, label string, total time.Duration, rec *recorder) (stop func()) {
	return every(time.Second, func() {
		fmt.Fprintf(w, "%s  %5.1fs/%.1fs  decisions=%d admitted=%d errors=%d\n",
			label, time.Since(rec.start).Seconds(), total.Seconds(),
			rec.decisions.Load(), rec.admitted.Load(), rec.errored.Load())
	})
}

// every calls fn every interval, in its own goroutine, until stop is called;
// stop waits for a call in progress.
func every(interval time.Duration, fn func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fn()
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

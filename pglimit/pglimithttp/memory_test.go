package pglimithttp_test

import (
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
)

// answer429 is an upstream that answers every request 429, Retry-After 60.
type answer429 struct{}

func (answer429) RoundTrip(r *http.Request) (*http.Response, error) {
	h := http.Header{}
	h.Set("Retry-After", "60")
	return &http.Response{StatusCode: http.StatusTooManyRequests, Header: h, Body: http.NoBody, Request: r}, nil
}

// The pause map's memory bound: a Transport whose upstream answers 429 on
// each of many distinct keys keeps each key's pause while it is in force
// (MaxPause, 1 s here), and nothing of any key once every pause has ended
// and the process has been idle for the sweep's second more. 100,000 keys
// in the full tier, 10,000 in the quick one.
func TestMemoryIdlePausedKeys(t *testing.T) {
	keys := 100_000
	if testing.Short() {
		keys = 10_000
	}
	const maxPause = time.Second
	pcfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 16
	pcfg.ConnConfig.RuntimeParams["search_path"] = ""
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: testdb.Schema(t), Namespace: "paused",
		Limits: []pglimit.Limit{{Rate: 1000, Period: time.Second, Burst: 1000}}})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := pglimithttp.NewTransport(&pglimithttp.TransportConfig{Limiter: lim, Base: answer429{}, MaxPause: maxPause,
		Key: func(r *http.Request) (string, error) { return strings.TrimPrefix(r.URL.Path, "/"), nil }})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	send := func(prefix string, n int) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 64)
		for i := range n {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				resp, err := client.Get(fmt.Sprintf("http://upstream.test/%s-%d.tenant.example", prefix, i))
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusTooManyRequests {
					t.Errorf("status %d, want the upstream's 429", resp.StatusCode)
				}
			})
		}
		wg.Wait()
	}
	// A warm-up whose pauses end before the measure, so that what is
	// measured is per key and not the pool's and limiter's first
	// allocations.
	send("warm", 200)
	time.Sleep(maxPause + 1100*time.Millisecond)
	before := testdb.LiveHeap()
	start := time.Now()
	send("k", keys)
	busy, inForce := testdb.LiveHeap(), pglimithttp.PausedKeys(tr)
	time.Sleep(maxPause + 1100*time.Millisecond)
	after, kept := testdb.LiveHeap(), pglimithttp.PausedKeys(tr)
	perKey := func(h uint64) float64 { return (float64(h) - float64(before)) / float64(keys) }
	t.Logf("%d keys paused in %s: %d pauses held, live heap %.0f B per key, at the end; idle, %d held, %.1f B per key",
		keys, time.Since(start).Round(time.Millisecond), inForce, perKey(busy), kept, perKey(after))
	if kept != 0 {
		t.Errorf("idle, every pause ended, the Transport still holds %d keys' pauses; want none", kept)
	}
	if bound := float64(testdb.IdleBytesPerKey*keys + testdb.IdleNoise); float64(after)-float64(before) > bound {
		t.Errorf("idle, the Transport keeps %.1f B per key, %.0f B in all; the bound is %d B per key and %d B", perKey(after), float64(after)-float64(before), testdb.IdleBytesPerKey, testdb.IdleNoise)
	}
	runtime.KeepAlive(tr)
}

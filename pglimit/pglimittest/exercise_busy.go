package pglimittest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// busyLimit is a limit of thousands a second with a burst, under which a
// busy key is leased (docs/limits.md, "Leases").
var busyLimit = pglimit.Limit{Name: "busy", Rate: 2000, Period: time.Second, Burst: 40}

// exerciseBusyKey runs one key of a high-rate limit from two instances, as
// hard as they can, and checks every admission against the limit, from
// the callers' timings. A strategy that supports only a cooldown (Range)
// skips it.
func (s *suite) exerciseBusyKey(t *testing.T) {
	t.Run("BusyKeyNeverOverAdmits", func(t *testing.T) {
		t.Parallel()
		b := &bundle{schema: testdb.SchemaOn(t, s.opts.serverURL(t), s.opts.prepare), pool: s.opts.pool(t)}
		cfg := &pglimit.Config{Schema: b.schema, Limits: []pglimit.Limit{busyLimit}}
		first, err := s.newLimiter(b.pool, cfg)
		if errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Skipf("the strategy takes no such limit: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		lims := []pglimit.Limiter{first, mustNew(t, s.newLimiter, s.opts.pool(t), cfg)}
		const run = time.Second
		adm := busy(t, lims, 16, "hot", run)
		if over := overBusy(adm, busyLimit); over > 0 {
			t.Fatalf("%d of %d admissions end a run of more than Burst + w/T", over, len(adm))
		}
		if len(adm) <= busyLimit.Burst {
			t.Fatalf("%d admitted in %s, at most the burst (%d): the limit's rate was not used", len(adm), run, busyLimit.Burst)
		}
		t.Logf("%d admitted in %s; the limit allows %d", len(adm), run, busyLimit.Burst+int(run/(time.Second/time.Duration(busyLimit.Rate))))
	})
}

// timed is an admission as its caller saw it: it was decided at some
// instant between sent and received.
type timed struct{ sent, received time.Time }

// busy runs workers callers of key, spread over lims, for d, and returns
// the admissions in the order they were sent.
func busy(t *testing.T, lims []pglimit.Limiter, workers int, key string, d time.Duration) []timed {
	t.Helper()
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		adm []timed
	)
	stop := time.Now().Add(d)
	for w := range workers {
		wg.Go(func() {
			var mine []timed
			for time.Now().Before(stop) {
				sent := time.Now()
				d, err := lims[w%len(lims)].Allow(context.Background(), key)
				if err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				if d.Allowed {
					mine = append(mine, timed{sent, time.Now()})
				}
			}
			mu.Lock()
			adm = append(adm, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(adm, func(a, b timed) int { return a.sent.Compare(b.sent) })
	return adm
}

// overBusy counts the admissions b, in adm sorted by sent, that end a run
// a..b proven over a GCRA limit's bound: its k = b-a+1 admissions were
// decided within [sent(a), the latest received of adm[:b+1]], of length w,
// and k > Burst + floor(w/T), that is (k - Burst)*T > w. In one pass: the
// smallest a*T - sent(a) so far settles every run ending at b.
func overBusy(adm []timed, l pglimit.Limit) (over int) {
	if len(adm) == 0 {
		return 0
	}
	p, r := l.Period.Microseconds(), int64(l.Rate)
	T := time.Duration((p+r-1)/r) * time.Microsecond // as the library rounds it
	origin := adm[0].sent
	var latest, low time.Duration
	for b, a := range adm {
		latest = max(latest, a.received.Sub(origin))
		if v := time.Duration(b)*T - a.sent.Sub(origin); b == 0 || v < low {
			low = v
		}
		if time.Duration(b+1)*T-latest-time.Duration(l.Burst)*T > low {
			over++
		}
	}
	return over
}

package pglimithttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
)

// upstream is a real HTTP server on loopback that enforces its own limit
// (GCRA: rate per second, burst), or answers as answer says, and records
// every request it sees.
type upstream struct {
	srv *httptest.Server

	mu       sync.Mutex
	arrivals []arrival
	tat      time.Time
	t, tau   time.Duration
	answer   func(n int, r *http.Request) (status int, retryAfter string) // nil: the limit decides
}

type arrival struct {
	at       time.Time
	sent     time.Time // when the Transport sent it: the X-Sent header the test's transports set
	instance string    // the X-Instance header the test's transports set
	path     string
	status   int
}

func newUpstream(t *testing.T, rate, burst int) *upstream {
	u := &upstream{t: time.Second / time.Duration(rate)}
	u.tau = time.Duration(burst-1) * u.t
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		now := time.Now()
		status, ra := http.StatusOK, ""
		if u.answer != nil {
			status, ra = u.answer(len(u.arrivals), r)
		} else if base := latest(u.tat, now); base.Sub(now) > u.tau {
			status, ra = http.StatusTooManyRequests, "1"
		} else {
			u.tat = base.Add(u.t)
		}
		var sent time.Time
		if ns, err := strconv.ParseInt(r.Header.Get("X-Sent"), 10, 64); err == nil {
			sent = time.Unix(0, ns)
		}
		u.arrivals = append(u.arrivals, arrival{now, sent, r.Header.Get("X-Instance"), r.URL.Path, status})
		u.mu.Unlock()
		if ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (u *upstream) seen() []arrival {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.arrivals)
}

// instanceHeader marks each request with its instance, and the time the
// Transport sent it, as it is sent.
type instanceHeader struct {
	name string
	base http.RoundTripper
}

func (h instanceHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Instance", h.name)
	r.Header.Set("X-Sent", strconv.FormatInt(time.Now().UnixNano(), 10))
	return h.base.RoundTrip(r)
}

// budget is a limiter of rate a second with burst on db, in schema.
func budget(t *testing.T, db pglimit.DB, schema string, rate, burst int) pglimit.Limiter {
	t.Helper()
	lim, err := pglimit.New(db, &pglimit.Config{Schema: schema, Namespace: "upstream",
		Limits: []pglimit.Limit{{Name: "upstream", Rate: rate, Period: time.Second, Burst: burst}}})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// transports are two instances of an application, one through PgBouncer,
// each with its Transport over a budget of rate a second with burst.
func transports(t *testing.T, rate, burst int, edit func(*pglimithttp.TransportConfig)) []*http.Client {
	t.Helper()
	schema := testdb.Schema(t)
	var clients []*http.Client
	for i, db := range []pglimit.DB{testdb.Pool(t), testdb.PgBouncerPool(t)} {
		cfg := pglimithttp.TransportConfig{Limiter: budget(t, db, schema, rate, burst), Base: instanceHeader{fmt.Sprint(i), http.DefaultTransport}}
		if edit != nil {
			edit(&cfg)
		}
		tr, err := pglimithttp.NewTransport(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, &http.Client{Transport: tr})
	}
	return clients
}

// Two instances, 8 callers, a budget of 80% of the upstream's rate and
// half its burst: the requests leave the instances within the upstream's
// limit (GCRA, 40 a second, burst 4), judged at the moment each Transport
// sent them. (A budget equal to the limit is not enough: the database
// spaces the requests at the budget's rate on its clock, and a caller
// sends when its wait ends, a scheduling delay later; one late behind
// those admitted after it bunches them. That happened once in 120.)
//
// The upstream does not refuse by its own clock: each arrival comes a
// transit later (the client's pool of two idle connections a host redials
// for 8 callers, the server's goroutine), which a loaded machine stretches
// by tens of milliseconds, unevenly, and which no client controls. Judged
// on arrival, a run under load saw 4 of 120 refused.
func TestTransportStaysWithinBudget(t *testing.T) {
	t.Parallel()
	const rate, burst = 40, 4
	up := newUpstream(t, 1000, 1000)
	up.answer = func(int, *http.Request) (int, string) { return http.StatusOK, "" }
	clients := transports(t, 32, 2, nil)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for range 15 {
				resp, err := clients[w%2].Get(up.srv.URL + "/")
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	seen := up.seen()
	if len(seen) != 120 {
		t.Fatalf("the upstream saw %d requests, want 120", len(seen))
	}
	var sent, arrived []time.Time
	transit := time.Duration(0)
	for _, a := range seen {
		sent, arrived = append(sent, a.sent), append(arrived, a.at)
		transit = max(transit, a.at.Sub(a.sent))
	}
	if over := overLimit(sent, rate, burst); over != 0 {
		t.Errorf("%d of 120 requests left the instances past the upstream's limit of %d/s (burst %d)", over, rate, burst)
	}
	t.Logf("120 requests in %s, through a budget of 32/s (burst 2); past the upstream's limit of %d/s (burst %d): %d as sent, %d on arrival (transit up to %s)",
		seen[len(seen)-1].at.Sub(seen[0].at).Round(time.Millisecond), rate, burst, overLimit(sent, rate, burst), overLimit(arrived, rate, burst), transit.Round(time.Millisecond))
}

// overLimit is how many of the requests at times a GCRA limit of rate a
// second with burst, meeting them in time order, refuses.
func overLimit(times []time.Time, rate, burst int) int {
	times = slices.Clone(times)
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	T := time.Second / time.Duration(rate)
	tau := time.Duration(burst-1) * T
	var tat time.Time
	over := 0
	for _, at := range times {
		base := latest(tat, at)
		if base.Sub(at) > tau {
			over++
			continue
		}
		tat = base.Add(T)
	}
	return over
}

// One 429 with Retry-After: 1 pauses both instances: no request reaches
// the upstream until the second has passed (but those the budget admitted
// before the pause was stored, in flight within 100 ms), and both resume
// after it.
func TestTransportPausesEveryInstance(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, 1000, 1000)
	up.answer = func(n int, _ *http.Request) (int, string) {
		if n == 20 {
			return http.StatusTooManyRequests, "1"
		}
		return http.StatusOK, ""
	}
	clients := transports(t, 200, 5, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", up.srv.URL+"/", nil)
				if resp, err := clients[w%2].Do(req); err == nil {
					resp.Body.Close()
				}
			}
		})
	}
	wg.Wait()
	seen := up.seen()
	i := slices.IndexFunc(seen, func(a arrival) bool { return a.status == http.StatusTooManyRequests })
	if i < 0 {
		t.Fatal("the upstream never answered 429")
	}
	paused := seen[i].at
	resumed := map[string]time.Duration{}
	for _, a := range seen[i+1:] {
		since := a.at.Sub(paused)
		if since > 100*time.Millisecond && since < time.Second {
			t.Errorf("instance %s sent a request %s after the 429 of Retry-After: 1", a.instance, since)
		}
		if _, ok := resumed[a.instance]; !ok && since >= time.Second {
			resumed[a.instance] = since
		}
	}
	if len(resumed) != 2 {
		t.Errorf("instances that resumed after the pause: %v, want both", resumed)
	}
	t.Logf("the 429 came at request %d; the instances resumed %v after it", i+1, resumed)
}

// Retry-After values that are hostile or broken are clamped or replaced:
// a huge delay or a far date pause MaxPause (300 ms), a malformed or
// negative one DefaultPause (100 ms), a date in the past nothing.
func TestTransportClampsRetryAfter(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, 1000, 1000)
	cases := map[string]string{
		"/huge":      "99999999999999999999999",
		"/far-date":  time.Now().Add(24 * time.Hour).UTC().Format(http.TimeFormat),
		"/malformed": "soon",
		"/negative":  "-5",
		"/past-date": time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat),
	}
	want := map[string]time.Duration{"/huge": 300 * time.Millisecond, "/far-date": 300 * time.Millisecond,
		"/malformed": 100 * time.Millisecond, "/negative": 100 * time.Millisecond, "/past-date": 0}
	first := map[string]bool{}
	up.answer = func(_ int, r *http.Request) (int, string) {
		if !first[r.URL.Path] {
			first[r.URL.Path] = true
			return http.StatusTooManyRequests, cases[r.URL.Path]
		}
		return http.StatusOK, ""
	}
	clients := transports(t, 1000, 100, func(c *pglimithttp.TransportConfig) {
		c.Key = func(r *http.Request) (string, error) { return r.URL.Path, nil }
		c.MaxPause, c.DefaultPause = 300*time.Millisecond, 100*time.Millisecond
	})
	for path := range cases {
		t.Run(path[1:], func(t *testing.T) {
			for range 2 {
				resp, err := clients[1].Get(up.srv.URL + path)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
			var at []time.Time
			for _, a := range up.seen() {
				if a.path == path {
					at = append(at, a.at)
				}
			}
			if len(at) != 2 {
				t.Fatalf("%d requests seen", len(at))
			}
			gap := at[1].Sub(at[0])
			if gap < want[path] || gap > want[path]+250*time.Millisecond {
				t.Errorf("the request after a 429 of Retry-After %q came %s later, want %s", cases[path], gap, want[path])
			}
		})
	}
}

// Failing fast, a request over the budget is a ThrottledError and never
// reaches the upstream; waiting, a request whose context ends gives its
// reserved slot back.
func TestTransportFailFastAndGiveUp(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, 1000, 1000)
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	lim := budget(t, pool, schema, 1, 1)
	newClient := func(failFast bool) *http.Client {
		tr, err := pglimithttp.NewTransport(&pglimithttp.TransportConfig{Limiter: lim, FailFast: failFast})
		if err != nil {
			t.Fatal(err)
		}
		return &http.Client{Transport: tr}
	}
	fast, patient := newClient(true), newClient(false)
	resp, err := fast.Get(up.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_, err = fast.Get(up.srv.URL)
	var te *pglimithttp.ThrottledError
	if !errors.Is(err, pglimithttp.ErrThrottled) || !errors.As(err, &te) || te.RetryAfter <= 0 || te.RetryAfter > time.Second {
		t.Fatalf("a request past the budget, failing fast: %v; want a ThrottledError within a second", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", up.srv.URL, nil)
	if _, err := patient.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a request whose context ends while it waits: %v", err)
	}
	if n := len(up.seen()); n != 1 {
		t.Fatalf("the upstream saw %d requests, want the first alone", n)
	}
	// The waiter's slot was given back: the key waits for the first
	// request's unit alone, under a second, not two.
	st, err := pglimit.Inspect(context.Background(), testdb.Limiter(t, pool, &pglimit.Config{Schema: schema, Namespace: "upstream",
		Limits: []pglimit.Limit{{Name: "upstream", Rate: 1, Period: time.Second, Burst: 1}}}), up.srv.Listener.Addr().String())
	if err != nil || st.Limits[0].RetryAfter > time.Second {
		t.Fatalf("the budget after a waiter gave up: %+v, %v; want its slot back", st, err)
	}
}

// A request that waiting would send only after its context's deadline
// fails at once, unsent, with a ThrottledError that says when to retry
// and matches context.DeadlineExceeded: behind the budget, and behind a
// pause the upstream asked for.
func TestTransportPastDeadline(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, 1000, 1000)
	up.answer = func(_ int, r *http.Request) (int, string) {
		if r.URL.Path == "/busy" {
			return http.StatusTooManyRequests, "2"
		}
		return http.StatusOK, ""
	}
	schema := testdb.Schema(t)
	for _, tc := range []struct {
		name, first string
		rate        int
		wait        time.Duration // how far off the next unit is after the first request
	}{
		{"behind the budget", "/", 1, time.Second},
		{"behind a pause", "/busy", 1000, 2 * time.Second},
	} {
		lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: schema, Namespace: "deadline-" + fmt.Sprint(tc.rate),
			Limits: []pglimit.Limit{{Rate: tc.rate, Period: time.Second, Burst: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := pglimithttp.NewTransport(&pglimithttp.TransportConfig{Limiter: lim})
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: tr}
		resp, err := client.Get(up.srv.URL + tc.first)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		sent := len(up.seen())

		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "GET", up.srv.URL, nil)
		start := time.Now()
		_, err = client.Do(req)
		took := time.Since(start)
		cancel()
		var te *pglimithttp.ThrottledError
		switch {
		case !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, pglimithttp.ErrThrottled) || !errors.As(err, &te):
			t.Errorf("%s: a request 200ms from its deadline: %v; want a ThrottledError matching context.DeadlineExceeded", tc.name, err)
		case te.RetryAfter < tc.wait-200*time.Millisecond || te.RetryAfter > tc.wait:
			t.Errorf("%s: RetryAfter %s, want the wait for the next unit, in [%s, %s]", tc.name, te.RetryAfter, tc.wait-200*time.Millisecond, tc.wait)
		}
		if took > 150*time.Millisecond {
			t.Errorf("%s: the request failed after %s, want at once", tc.name, took)
		}
		if n := len(up.seen()); n != sent {
			t.Errorf("%s: the upstream saw %d requests, want %d: the late one is never sent", tc.name, n, sent)
		}
	}
}

// sendLog records when the Transport hands each request to the network:
// the moment it sends.
type sendLog struct {
	base http.RoundTripper

	mu    sync.Mutex
	sends []time.Time
}

func (s *sendLog) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.sends = append(s.sends, time.Now())
	s.mu.Unlock()
	return s.base.RoundTrip(r)
}

// between counts the sends in (from, to).
func (s *sendLog) between(from, to time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, at := range s.sends {
		if at.After(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// A pause holds back the requests that already hold their unit: 40
// callers on two instances, all of whose units the budget (10 a second)
// reserved before the upstream answered the 15th request 429 with
// Retry-After: 2. The instance that got the 429 sends nothing from then
// until the pause ends; the other, which learns of the pause only through
// the database, sends at most the requests it had waiting for their turn
// when the pause was stored (its 20 callers), and none it reserved after.
func TestTransportPauseHoldsWaiters(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, 1000, 1000)
	up.answer = func(n int, _ *http.Request) (int, string) {
		if n == 14 {
			return http.StatusTooManyRequests, "2"
		}
		return http.StatusOK, ""
	}
	logs := map[string]*sendLog{}
	clients := transports(t, 10, 2, func(c *pglimithttp.TransportConfig) {
		l := &sendLog{base: c.Base}
		logs[c.Base.(instanceHeader).name] = l
		c.Base = l
	})
	var (
		mu        sync.Mutex
		answered  time.Time // when the 429's RoundTrip returned to its caller
		answering string
		wg        sync.WaitGroup
	)
	for i := range 40 {
		wg.Go(func() {
			resp, err := clients[i%2].Get(up.srv.URL + "/")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusTooManyRequests {
				mu.Lock()
				answered, answering = time.Now(), fmt.Sprint(i%2)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	seen := up.seen()
	i := slices.IndexFunc(seen, func(a arrival) bool { return a.status == http.StatusTooManyRequests })
	if i < 0 || answered.IsZero() {
		t.Fatal("the upstream never answered 429")
	}
	ends := seen[i].at.Add(2 * time.Second) // the pause ends no sooner
	other := map[string]string{"0": "1", "1": "0"}[answering]
	inWindow := 0
	for _, a := range seen[i+1:] {
		if a.at.Before(ends) {
			inWindow++
		}
	}
	same, others := logs[answering].between(answered, ends), logs[other].between(answered, ends)
	if same != 0 {
		t.Errorf("the instance that got the 429 sent %d requests during the pause it learnt", same)
	}
	if others > 20 {
		t.Errorf("the other instance sent %d requests during the pause, more than its 20 callers", others)
	}
	t.Logf("the 429 came at request %d; during the pause the upstream saw %d more, %d of them sent by the other instance", i+1, inWindow, others)
}

package pglimithttp_test

import (
	"cmp"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
)

// nginx's "limit_req rate=30r/m burst=5" across every instance: ten
// requests at once, one served at once, five held and released one every
// 2 s, four refused. Each line is a request, in the order answered; a dot
// is a second it was held.
func ExampleConfig_maxDelay() {
	lim, done := exampleLimiterOf(pglimit.Config{
		Namespace: "example-shaping",
		Limits:    []pglimit.Limit{{Name: "per-minute", Rate: 30, Period: time.Minute, Burst: 1}},
	})
	defer done()
	mw, err := pglimithttp.Middleware(lim, &pglimithttp.Config{
		KeyFunc:  pglimithttp.FromHeader("X-User"),
		MaxDelay: 5 * 2 * time.Second, // burst=5: five slots of 2 s
	})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	defer srv.Close()

	type answer struct {
		after time.Duration
		line  string
	}
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
	)
	start := time.Now()
	for range 10 {
		wg.Go(func() {
			req, _ := http.NewRequest("GET", srv.URL, nil)
			req.Header.Set("X-User", "user-42")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				panic(err)
			}
			resp.Body.Close()
			after := time.Since(start).Round(time.Second)
			line := fmt.Sprintf("%d at %3s |%s", resp.StatusCode, after, strings.Repeat(".", int(after/time.Second)))
			if resp.StatusCode == http.StatusTooManyRequests {
				line += " refused, Retry-After " + resp.Header.Get("Retry-After")
			}
			mu.Lock()
			answers = append(answers, answer{after, line})
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(answers, func(a, b answer) int { return cmp.Or(cmp.Compare(a.after, b.after), strings.Compare(a.line, b.line)) })
	for _, a := range answers {
		fmt.Println(strings.TrimRight(a.line, " "))
	}
	// Output:
	// 200 at  0s |
	// 429 at  0s | refused, Retry-After 2
	// 429 at  0s | refused, Retry-After 2
	// 429 at  0s | refused, Retry-After 2
	// 429 at  0s | refused, Retry-After 2
	// 200 at  2s |..
	// 200 at  4s |....
	// 200 at  6s |......
	// 200 at  8s |........
	// 200 at 10s |..........
}

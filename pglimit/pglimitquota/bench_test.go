package pglimitquota_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
)

// BenchmarkAllow compares a quota's Allow, without and with an id, to a
// pglimit limiter of one calendar-month FixedWindow (the closest the
// root package has to a monthly quota), all admissions of one key, one
// at a time, taking turns so that the machine's load falls on all
// alike. It reports the median of each and the ratios to the fixed
// window, on a pool that prepares its statements (direct) and on one
// through PgBouncer, which prepares none: there the server plans every
// statement on every call.
//
//	go test -run '^$' -bench Allow -benchtime 3000x ./pglimit/pglimitquota
func BenchmarkAllow(b *testing.B) {
	b.Run("direct", func(b *testing.B) { benchmarkAllow(b, testdb.Pool(b)) })
	b.Run("pgbouncer", func(b *testing.B) { benchmarkAllow(b, testdb.PgBouncerPool(b)) })
}

func benchmarkAllow(b *testing.B, pool pglimit.DB) {
	ctx := context.Background()
	schema := testdb.Schema(b)
	q, err := pglimitquota.New(pool, &pglimitquota.Config{Schema: schema, Namespace: "bench", Allowance: pglimitquota.MaxUnits, Thresholds: []float64{0.8, 1}})
	if err != nil {
		b.Fatal(err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "bench", Limits: []pglimit.Limit{
		{Name: "month", Rate: 1 << 30, Algorithm: pglimit.FixedWindow, Calendar: "month"},
	}})
	if err != nil {
		b.Fatal(err)
	}
	calls := []func(i int) (bool, error){
		func(int) (bool, error) { d, err := lim.Allow(ctx, "k"); return d.Allowed, err },
		func(int) (bool, error) { d, err := q.Allow(ctx, "k", 1); return d.Allowed, err },
		func(i int) (bool, error) {
			d, err := q.Allow(pglimit.WithID(ctx, "id-"+strconv.Itoa(i)), "k", 1)
			return d.Allowed, err
		},
	}
	took := make([][]time.Duration, len(calls))
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		ok, err := calls[i%3](i)
		if err != nil || !ok {
			b.Fatalf("call %d: %v, %v", i%3, ok, err)
		}
		took[i%3] = append(took[i%3], time.Since(start))
	}
	var p50 [3]float64
	for i, name := range []string{"fixedwindow", "quota", "quota-id"} {
		if len(took[i]) == 0 {
			return
		}
		slices.Sort(took[i])
		p50[i] = float64(took[i][len(took[i])/2].Nanoseconds()) / 1000
		b.ReportMetric(p50[i], "µs/"+name+"-p50")
	}
	b.ReportMetric(p50[1]/p50[0], "quota/fixedwindow")
	b.ReportMetric(p50[2]/p50[0], "quota-id/fixedwindow")
}

// BenchmarkRefuse is BenchmarkAllow for refusals: a key whose hard cap
// is spent against a calendar-month FixedWindow whose one unit is. A
// quota's refusal is not its common case (quota.allow_kept), so it takes
// two statements: that one, which matches no row, and quota.allow.
//
//	go test -run '^$' -bench Refuse -benchtime 3000x ./pglimit/pglimitquota
func BenchmarkRefuse(b *testing.B) {
	ctx := context.Background()
	pool, schema := testdb.Pool(b), testdb.Schema(b)
	q, err := pglimitquota.New(pool, &pglimitquota.Config{Schema: schema, Namespace: "bench", Allowance: 1})
	if err != nil {
		b.Fatal(err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "bench", Limits: []pglimit.Limit{
		{Name: "month", Rate: 1, Algorithm: pglimit.FixedWindow, Calendar: "month"},
	}})
	if err != nil {
		b.Fatal(err)
	}
	calls := []func() (bool, error){
		func() (bool, error) { d, err := lim.Allow(ctx, "k"); return d.Allowed, err },
		func() (bool, error) { d, err := q.Allow(ctx, "k", 1); return d.Allowed, err },
	}
	for _, call := range calls {
		if ok, err := call(); err != nil || !ok {
			b.Fatalf("the first call: %v, %v", ok, err)
		}
	}
	took := make([][]time.Duration, len(calls))
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		ok, err := calls[i%2]()
		if err != nil || ok {
			b.Fatalf("call %d: %v, %v; want a refusal", i%2, ok, err)
		}
		took[i%2] = append(took[i%2], time.Since(start))
	}
	if len(took[1]) == 0 {
		return
	}
	var p50 [2]float64
	for i, name := range []string{"fixedwindow", "quota"} {
		slices.Sort(took[i])
		p50[i] = float64(took[i][len(took[i])/2].Nanoseconds()) / 1000
		b.ReportMetric(p50[i], "µs/"+name+"-p50")
	}
	b.ReportMetric(p50[1]/p50[0], "quota/fixedwindow")
}

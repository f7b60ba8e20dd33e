package pglimitprom_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/pglimitprom"
)

// The pool collector reports the pool's 13 series, read at scrape time, and
// they pass the Prometheus linter.
func TestPoolCollector(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(pglimitprom.NewPoolCollector(pool, "main"))
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := value(t, reg, "pglimit_pool_max_connections", "pool", "main"), float64(pool.Config().MaxConns); got != want {
		t.Errorf("max connections %v, want %v", got, want)
	}
	if got := value(t, reg, "pglimit_pool_acquires_total", "pool", "main"); got < 1 {
		t.Errorf("acquires %v, want at least 1", got)
	}
	if n := testutil.CollectAndCount(reg); n != 13 {
		t.Errorf("%d pool series, want 13", n)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
	var sb strings.Builder
	for _, n := range []string{"pglimit_pool_idle_connections", "pglimit_pool_connections"} {
		if value(t, reg, n, "pool", "main") < 0 {
			sb.WriteString(n + " missing; ")
		}
	}
	if sb.Len() > 0 {
		t.Error(sb.String())
	}
}

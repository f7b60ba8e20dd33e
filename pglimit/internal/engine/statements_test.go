package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
)

// gcraLimit is a GCRA limit of rate per period with a burst of rate.
func gcraLimit(name string, rate int64, period time.Duration) LimitSpec {
	p := period.Microseconds()
	t := (p + rate - 1) / rate
	return LimitSpec{Name: name, Burst: rate, Limit: arith.Limit{Algorithm: arith.GCRA, Period: p, Rate: rate, T: t, BurstT: rate * t}}
}

// windowLimit is a fixed window of rate per period.
func windowLimit(name string, rate int64, period time.Duration) LimitSpec {
	p := period.Microseconds()
	return LimitSpec{Name: name, Limit: arith.Limit{Algorithm: arith.FixedWindow, Period: p, Rate: rate, T: (p + rate - 1) / rate}}
}

func spec(s Strategy, limits ...LimitSpec) Spec {
	return Spec{Strategy: s, Schema: "public", Table: "pglimit_" + string(s), Limits: limits,
		Timeout: 1500 * time.Microsecond, IDRetention: time.Hour, MaxPeriod: (366 * 24 * time.Hour).Microseconds()}
}

// Build writes each statement its docs promise, and leaves empty those
// they say a limiter of the Spec has none of.
func TestBuildWritesWhatTheSpecHas(t *testing.T) {
	single := gcraLimit("a", 10, time.Second)
	window := windowLimit("b", 100, time.Minute)
	for _, c := range []struct {
		name                        string
		spec                        Spec
		general, ids, reserve, keys bool
		overrides, batchBack        bool
	}{
		{"upsert single", spec(Upsert, single), true, true, true, true, false, true},
		{"nowait general", spec(NoWait, single, window), true, true, false, true, false, false},
		{"upsert overrides", func() Spec { s := spec(Upsert, single); s.Overrides = true; return s }(), true, false, true, true, true, false},
		{"range", spec(Range, single), false, false, false, false, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := Build(c.spec)
			if st.Fast == "" || st.FastTx == "" || st.Peek == "" || st.Keys.Reset == "" || st.Keys.Inspect == "" {
				t.Errorf("a statement every strategy has is empty: %+v", st.Decide)
			}
			if got := st.General != nil; got != c.general {
				t.Errorf("General written: %t, want %t", got, c.general)
			}
			if st.General != nil {
				if got := st.General.Own[arith.Reserve] != ""; got != c.reserve {
					t.Errorf("Reserve's general statement written: %t, want %t (only when every limit is GCRA)", got, c.reserve)
				}
				if st.General.Own[arith.Allow] == "" || st.General.Tx[arith.AtMost] == "" {
					t.Error("Allow's or AllowAtMost's general statement is empty")
				}
			}
			if got := st.IDs != nil; got != c.ids {
				t.Errorf("IDs written: %t, want %t (not for Range or Overrides)", got, c.ids)
			}
			k := st.Keys
			for name, sql := range map[string]string{"Refund": k.Refund, "Settle": k.Settle, "Pause": k.Pause, "Blank": k.Blank, "Limited": k.Limited, "Batch.SQL": st.Batch.SQL, "Batch.WaitSQL": st.Batch.WaitSQL} {
				if got := sql != ""; got != c.keys {
					t.Errorf("%s written: %t, want %t (none for Range)", name, got, c.keys)
				}
			}
			if got := st.Batch.BackSQL != ""; got != c.batchBack {
				t.Errorf("Batch.BackSQL written: %t, want %t (a single GCRA limit's lease only)", got, c.batchBack)
			}
			for name, sql := range map[string]string{"SetLimits": k.SetLimits, "DeleteLimits": k.DeleteLimits, "ListLimits": k.ListLimits} {
				if got := sql != ""; got != c.overrides {
					t.Errorf("%s written: %t, want %t (with Overrides only)", name, got, c.overrides)
				}
			}
			if c.overrides && !strings.Contains(st.General.Own[arith.Allow], `"public"."pglimit_overrides"`) {
				t.Error("the general statement with Overrides does not read the overrides table beside the limiter's")
			}
		})
	}
}

// The statements on a table Citus distributes call its functions, in a
// caller's transaction with the Spec's Timeout, rounded up to whole
// milliseconds, as the function's lock_timeout.
func TestCitusCallsTheTablesFunctions(t *testing.T) {
	d := Citus(spec(NoWait, gcraLimit("a", 10, time.Second), windowLimit("b", 100, time.Minute)))
	if !strings.Contains(d.Fast, `"public"."pglimit_nowait_allow"`) || !strings.Contains(d.Peek, `"public"."pglimit_nowait_peek"`) {
		t.Errorf("the calls do not name the table's functions:\n%s\n%s", d.Fast, d.Peek)
	}
	if !strings.Contains(d.FastTx, "'2ms'") || strings.Contains(d.Fast, "'2ms'") {
		t.Errorf("only the call in a caller's transaction passes the lock_timeout, 1.5ms rounded up to 2ms:\n%s\n%s", d.Fast, d.FastTx)
	}
	if d.General == nil || !strings.Contains(d.General.Own[arith.Reserve], `"public"."pglimit_nowait_decide"`) {
		t.Errorf("the general calls do not name the decide function: %+v", d.General)
	}
	if r := Citus(spec(Range, gcraLimit("cooldown", 1, time.Second))); r.General != nil {
		t.Errorf("Range has no general statement on Citus either: %+v", r.General)
	}
}

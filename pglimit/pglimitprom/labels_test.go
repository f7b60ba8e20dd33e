package pglimitprom_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/pglimit/cooldown/pglimit/pglimitprom"
)

// The first Max distinct values pass, later ones are "other", a value
// seen before stays itself, and invalid UTF-8 is "other": under
// concurrent use too.
func TestCappedLabel(t *testing.T) {
	t.Parallel()
	c := pglimitprom.NewCappedLabel(3)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 3 {
				c.Value(fmt.Sprintf("user-%d", i))
			}
		})
	}
	wg.Wait()
	for _, tc := range []struct{ in, want string }{
		{"user-0", "user-0"},
		{"user-2", "user-2"},
		{"user-3", pglimitprom.OtherKey},
		{"user-1", "user-1"},
		{"\xff", pglimitprom.OtherKey},
	} {
		if got := c.Value(tc.in); got != tc.want {
			t.Errorf("Value(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

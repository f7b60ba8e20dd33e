package pglimit

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// NoWait's lock_timeout, in its SQL, is noWaitPatience.
func TestNoWaitPatienceInSQL(t *testing.T) {
	t.Parallel()
	if want := fmt.Sprintf("'%dms'", noWaitPatience.Milliseconds()); !strings.Contains(queries.Static("nowait.condition"), want) {
		t.Errorf("nowait.condition %q does not set %s", queries.Static("nowait.condition"), want)
	}
}

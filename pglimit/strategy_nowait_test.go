package pglimit

import (
	"fmt"
	"strings"
	"testing"
)

// NoWait's lock_timeout, in its SQL, is noWaitPatience.
func TestNoWaitPatienceInSQL(t *testing.T) {
	t.Parallel()
	if want := fmt.Sprintf("'%dms'", noWaitPatience.Milliseconds()); !strings.Contains(noWaitCondition, want) {
		t.Errorf("noWaitCondition %q does not set %s", noWaitCondition, want)
	}
}

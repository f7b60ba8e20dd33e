package pglimit_test

import (
	"testing"

	"github.com/pglimit/cooldown/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

package pglimitclean_test

import (
	"testing"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

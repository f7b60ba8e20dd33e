package pglimit_test

import (
	"testing"

	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

func TestMain(m *testing.M) { pglimittest.Main(m) }

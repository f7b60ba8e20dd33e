package pglimitsem_test

import (
	"testing"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// databaseURL stands for the application's database in the examples.
func databaseURL() string {
	url, err := pglimittest.ServerURL()
	if err != nil {
		panic(err)
	}
	return url
}

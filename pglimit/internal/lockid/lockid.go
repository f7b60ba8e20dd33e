// Package lockid derives the ids of the advisory locks the library takes.
// They are part of the deployed protocol: every version of the library
// must take the same lock for the same purpose.
package lockid

import (
	"hash/fnv"
	"slices"
	"strings"
)

// Of is the id of one of the advisory locks pglimit takes, derived from
// the lock's name by FNV-1a. The names below are part of the deployed
// protocol: an instance of an older version must still take the same lock
// as a new one, so a name or its derivation never changes
// (TestLockIDsAreStable pins the values).
//
//   - session locks, one bigint (T = int64, the 64-bit hash shifted right
//     so it is never negative): "pglimit/migrate", Migrate's database-wide
//     setup; "pglimit/migrate/<schema>", the schema's goose lock;
//     "pglimit/distribute", Distribute's; and
//     "pglimit/cleanup/<schema>/<tables>", the leadership of the cleaners
//     of that table set.
//   - transaction locks a first request takes on its key, two integers
//     (T = int32, the 32-bit hash): the class "<table>\x00<namespace>",
//     then hashtext(key) in SQL.
func Of[T int32 | int64](name string) T {
	var id T
	if _, ok := any(id).(int32); ok {
		h := fnv.New32a()
		h.Write([]byte(name))
		return T(int32(h.Sum32()))
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	return T(h.Sum64() >> 1)
}

// Setup serializes the part of Migrate that touches the whole
// database.
var Setup = Of[int64]("pglimit/migrate")

// Distribute serializes Distribute across instances: two
// create_distributed_table calls on one table would make the second fail.
var Distribute = Of[int64]("pglimit/distribute")

// Migration gives each schema its own goose lock, so migrating one
// schema never waits for another (and never for other goose users, whose
// default lock id is shared).
func Migration(schema string) int64 {
	return Of[int64]("pglimit/migrate/" + schema)
}

// Cleanup is the advisory lock that the cleaners of one table set
// compete for: the leader cleans exactly the tables the lock names, so
// cleaners configured with other tables of the same schema elect a leader
// of their own instead of waiting forever behind one that never cleans
// their tables. Order does not matter; identifiers cannot hold the
// separator.
func Cleanup(schema string, tables []string) int64 {
	sorted := slices.Sorted(slices.Values(tables))
	return Of[int64]("pglimit/cleanup/" + schema + "/" + strings.Join(sorted, ","))
}

// KeyClass is the first half of the advisory lock a first request
// takes on its key (the second is the key's hash, computed in SQL): one
// class per table (quoted and schema-qualified) and namespace, so that
// limiters on other tables or namespaces never wait for each other.
func KeyClass(table, namespace string) int32 {
	return Of[int32](table + "\x00" + namespace)
}

// SlotSeed seeds the hash of the advisory lock a semaphore's acquirer
// takes on the slot number it inserts: one per slots table (quoted and
// schema-qualified).
func SlotSeed(table string) int64 {
	return Of[int64](table)
}

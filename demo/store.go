package main

import (
	"context"
	_ "embed"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed schema.sql
var schemaSQL string

// migrateDemo creates the demo's table in schema. Instances starting
// together would race on CREATE TABLE IF NOT EXISTS (it can fail with a
// unique violation in the catalog), so they take turns on an advisory lock.
func migrateDemo(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	h := fnv.New64a()
	h.Write([]byte("pglimit-demo/migrate/" + schema))
	lockID := int64(h.Sum64() >> 1)

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schemaSQL)
		return err
	})
	if err != nil {
		return fmt.Errorf("demo: migrate: %w", err)
	}
	return nil
}

// item is what the API returns.
type item struct {
	ID        int64     `json:"id"`
	User      string    `json:"user"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// maxListed bounds GET /items/{user}: the newest items come first.
const maxListed = 100

// store keeps items in demo_items, qualified by schema so that it works
// whatever the connection's search_path.
type store struct {
	pool      *pgxpool.Pool
	insertSQL string
	listSQL   string
	searchSQL string
}

func newStore(pool *pgxpool.Pool, schema string) *store {
	table := pgx.Identifier{schema, "demo_items"}.Sanitize()
	return &store{
		pool: pool,
		insertSQL: `INSERT INTO ` + table + ` (user_name, name) VALUES ($1, $2)
			RETURNING id, user_name, name, created_at`,
		listSQL: `SELECT id, user_name, name, created_at FROM ` + table + `
			WHERE user_name = $1 ORDER BY id DESC LIMIT ` + fmt.Sprint(maxListed),
		searchSQL: `SELECT id, user_name, name, created_at FROM ` + table + `
			WHERE strpos(name, $1) > 0 ORDER BY id DESC LIMIT ` + fmt.Sprint(maxListed),
	}
}

func (s *store) create(ctx context.Context, user, name string) (item, error) {
	var it item
	err := s.pool.QueryRow(ctx, s.insertSQL, user, name).Scan(&it.ID, &it.User, &it.Name, &it.CreatedAt)
	return it, err
}

func (s *store) list(ctx context.Context, user string) ([]item, error) {
	return s.query(ctx, s.listSQL, user)
}

// search returns the latest items, of any user, whose name contains text.
func (s *store) search(ctx context.Context, text string) ([]item, error) {
	return s.query(ctx, s.searchSQL, text)
}

func (s *store) query(ctx context.Context, sql, arg string) ([]item, error) {
	rows, _ := s.pool.Query(ctx, sql, arg)
	items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (item, error) {
		var it item
		err := row.Scan(&it.ID, &it.User, &it.Name, &it.CreatedAt)
		return it, err
	})
	if items == nil {
		items = []item{} // JSON [] rather than null
	}
	return items, err
}

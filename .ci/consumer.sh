#!/usr/bin/env bash
# Builds a throwaway module outside the repository that uses pglimit the way
# an application would: it requires github.com/pglimit/cooldown (a replace
# points at this checkout, as a published version would be fetched), imports
# pglimit, pglimithttp, pglimitprom and pglimitsql, and runs go mod tidy, go
# build and go vet with an empty module cache. This is what breaks when the library's
# go.mod drags in a dependency the module proxy cannot serve.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

export GOMODCACHE="$work/modcache" GOFLAGS=-mod=mod GOWORK=off
mkdir "$work/app"
cd "$work/app"
cat >go.mod <<MOD
module example.com/consumer

go 1.26

require github.com/pglimit/cooldown v0.0.0

replace github.com/pglimit/cooldown => $repo
MOD
cat >main.go <<'GO'
// Command consumer is an application that rate-limits one route with
// pglimit's middleware and another inside a database/sql transaction, and
// exports its metrics.
package main

import (
	"context"
	"database/sql"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
	"github.com/pglimit/cooldown/pglimit/pglimitprom"
	"github.com/pglimit/cooldown/pglimit/pglimitsql"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool, ""); err != nil {
		log.Fatal(err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{Cooldown: 2 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if _, err := pglimitprom.New(reg, nil); err != nil {
		log.Fatal(err)
	}
	reg.MustRegister(pglimitprom.NewPoolCollector(pool, "main"))
	limit, err := pglimithttp.Middleware(lim, &pglimithttp.Config{})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /export", limit(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})))
	sqlDB, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	reports, err := pglimit.New(pglimitsql.DB(sqlDB), &pglimit.Config{Namespace: "report", Cooldown: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	mux.HandleFunc("POST /report", func(w http.ResponseWriter, r *http.Request) {
		tx, err := sqlDB.BeginTx(r.Context(), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback()
		d, err := reports.AllowTx(r.Context(), pglimitsql.Tx(tx), "team")
		if err != nil || !d.Allowed || tx.Commit() != nil {
			http.Error(w, "try later", http.StatusTooManyRequests)
			return
		}
		w.Write([]byte("queued\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}
GO

echo "consumer: go mod tidy (empty module cache, GOPROXY=$(go env GOPROXY))"
go mod tidy
echo "consumer: go build"
go build -o consumer .
echo "consumer: go vet"
go vet ./...
graph=$(go list -m all)
if grep -E "testcontainers|gonum.org/v1/plot|hdrhistogram|go-ansiterm|gorm.io|jmoiron/sqlx|lib/pq|riverqueue" <<<"$graph"; then
  echo "consumer: the module graph holds test, tool, ORM or job queue dependencies (above)"; exit 1
fi
# goose's go.mod names gRPC and OpenTelemetry, so they are in the graph;
# their code must not be downloaded: it is pglimitgrpc's and pglimitotel's.
if ls "$GOMODCACHE"/cache/download/google.golang.org/grpc/@v/*.zip \
  "$GOMODCACHE"/cache/download/go.opentelemetry.io/otel/@v/*.zip 2>/dev/null; then
  echo "consumer: gRPC or OpenTelemetry was downloaded (above); only pglimitgrpc and pglimitotel may need them"; exit 1
fi
echo "consumer: ok: $(wc -l <<<"$graph") modules in the graph, binary $(stat -c %s consumer) bytes"

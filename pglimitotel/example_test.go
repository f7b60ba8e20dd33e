package pglimitotel_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimitotel"
)

// A limiter measured through the global meter and tracer providers, which
// the application's OpenTelemetry setup (an OTLP exporter, say) installs.
func ExampleNew() {
	pool, err := pgxpool.New(context.Background(), "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	obs, err := pglimitotel.New(&pglimitotel.Options{
		MeterProvider:  otel.GetMeterProvider(),
		TracerProvider: otel.GetTracerProvider(),
	})
	if err != nil {
		log.Fatal(err)
	}
	// One observer serves every limiter that names it.
	lim, err := pglimit.New(pool, &pglimit.Config{Namespace: "search", Cooldown: 2 * time.Second, Observer: obs})
	if err != nil {
		log.Fatal(err)
	}
	_ = lim // decide with it as with any limiter
}

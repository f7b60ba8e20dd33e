package main

import (
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
	"github.com/pglimit/cooldown/pglimit/pglimitprom"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// Input limits of POST /items.
const (
	maxBodyBytes = 4 << 10
	maxUserBytes = 64
	maxNameBytes = 200
)

// app is the demo service: its store, limiter, metrics and routes.
type app struct {
	cfg     config
	log     *slog.Logger
	pool    *pgxpool.Pool
	items   *store
	reg     *prometheus.Registry
	metrics *httpMetrics
	limit   func(http.Handler) http.Handler // GET /items/{user}: the cooldown
	create  http.Handler                    // POST /items past decoding: the item limits, then the store
	export  http.Handler                    // GET /exports/{user}: a slot of the user's, then the export
	search  http.Handler                    // GET /search/{org}/{user}: the org's and the user's limits, settled
	reports *reports                        // /orgs/{org}/... and /reports/{id}/done: the plan, credits, reports
}

func newApp(pool *pgxpool.Pool, cfg config, logger *slog.Logger) (*app, error) {
	a := &app{
		cfg: cfg, log: logger, pool: pool, items: newStore(pool, cfg.schema), reg: prometheus.NewRegistry(),
	}

	a.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		pglimitprom.NewPoolCollector(pool, "demo"),
	)
	lm, err := pglimitprom.New(a.reg, &pglimitprom.Options{MaxKeys: cfg.maxUsers})
	if err != nil {
		return nil, err
	}
	if a.metrics, err = newHTTPMetrics(a.reg, cfg); err != nil {
		return nil, err
	}

	lim, err := pglimit.New(pool, &pglimit.Config{
		Strategy:  cfg.strategy,
		Cooldown:  cfg.cooldown,
		Namespace: "list-items",
		Schema:    cfg.schema,
		Observer:  lm,
	})
	if err != nil {
		return nil, err
	}
	a.limit, err = pglimithttp.Middleware(lim, &pglimithttp.Config{
		KeyFunc:    pglimithttp.FromPathValue("user"),
		OnError:    cfg.onError,
		OnDecision: a.logDecision,
		Logger:     logger.With("limiter", "list-items"),
	})
	if err != nil {
		return nil, err
	}

	if itemStrategy(cfg.strategy) != cfg.strategy {
		logger.Info("the item limits use the upsert strategy: range enforces only a cooldown")
	}
	itemLim, err := pglimit.New(pool, &pglimit.Config{
		Strategy:  itemStrategy(cfg.strategy),
		Limits:    cfg.itemLimits(),
		Namespace: "create-item",
		Schema:    cfg.schema,
		// An operator may give a user limits of their own, for good or
		// for an hour (cmd/pglimit overrides set).
		Overrides: true,
		Observer:  lm,
	})
	if err != nil {
		return nil, fmt.Errorf("item limits: %w", err)
	}
	limitCreate, err := pglimithttp.Middleware(itemLim, &pglimithttp.Config{
		KeyFunc:    itemUser,
		OnError:    cfg.onError,
		OnDecision: a.logDecision,
		Logger:     logger.With("limiter", "create-item"),
	})
	if err != nil {
		return nil, err
	}
	a.create = limitCreate(http.HandlerFunc(a.storeItem))

	exports, err := pglimitsem.New(pool, &pglimitsem.Config{
		Schema: cfg.schema, Namespace: "exports", Slots: cfg.exportsAtOnce, TTL: 30 * time.Second,
		Observe: lm.ObserveSemaphore,
	})
	if err != nil {
		return nil, fmt.Errorf("export slots: %w", err)
	}
	holdSlot, err := pglimithttp.Concurrency(exports, &pglimithttp.Config{
		KeyFunc:    pglimithttp.FromPathValue("user"),
		OnError:    cfg.onError,
		OnDecision: a.logDecision,
		Logger:     logger.With("semaphore", "exports"),
	})
	if err != nil {
		return nil, err
	}
	// Past the user's own slots, an export waits for one of the fleet's
	// exportSlots, which organisations share by fair share: while several
	// wait, each runs as many exports as the others, whatever the number
	// it asked for (docs/limits.md, "Fair share").
	fleet, err := pglimitsem.New(pool, &pglimitsem.Config{
		Schema: cfg.schema, Namespace: "exports-fleet", Slots: cfg.exportSlots, TTL: 30 * time.Second,
		Observe: lm.ObserveSemaphore,
	})
	if err != nil {
		return nil, fmt.Errorf("fleet export slots: %w", err)
	}
	holdFleetSlot, err := pglimithttp.Concurrency(fleet, &pglimithttp.Config{
		KeyFunc:    func(*http.Request) (string, error) { return "exports", nil },
		FlowFunc:   exportOrg,
		FlowWait:   time.Minute,
		OnError:    cfg.onError,
		OnDecision: a.logDecision,
		Logger:     logger.With("semaphore", "exports-fleet"),
	})
	if err != nil {
		return nil, err
	}
	a.export = holdSlot(holdFleetSlot(http.HandlerFunc(a.exportItems)))

	// A search costs the items it finds, which only the search knows: it
	// is admitted on an estimate at the organisation's and the user's
	// limits at once, and settled with what it found.
	orgLimits, userLimits := cfg.searchLimits()
	orgLim, err := pglimit.New(pool, &pglimit.Config{Limits: orgLimits, Namespace: "search-org", Schema: cfg.schema})
	if err != nil {
		return nil, fmt.Errorf("search limits: %w", err)
	}
	userLim, err := pglimit.New(pool, &pglimit.Config{Limits: userLimits, Namespace: "search-user", Schema: cfg.schema})
	if err != nil {
		return nil, fmt.Errorf("search limits: %w", err)
	}
	limitSearch, err := pglimithttp.Levels([]pglimithttp.Level{
		{Limiter: orgLim, KeyFunc: pglimithttp.FromPathValue("org")},
		{Limiter: userLim, KeyFunc: searchUser},
	}, &pglimithttp.Config{
		CostFunc:   func(*http.Request) (int, error) { return searchEstimate, nil },
		Settle:     true,
		OnError:    cfg.onError,
		OnDecision: a.logDecision,
		Logger:     logger.With("limiter", "search"),
	})
	if err != nil {
		return nil, err
	}
	a.search = limitSearch(http.HandlerFunc(a.searchItems))
	if a.reports, err = newReports(a, pool); err != nil {
		return nil, err
	}
	return a, nil
}

// searchEstimate is what a search is admitted on: the items it is
// expected to find. It is settled with what it found.
const searchEstimate = 10

// searchUser is the key of a user of an organisation: both names.
func searchUser(r *http.Request) (string, error) {
	return r.PathValue("org") + "/" + r.PathValue("user"), nil
}

// itemStrategy is the strategy of the item limits: the configured one,
// except Range, which enforces only a cooldown.
func itemStrategy(s pglimit.Strategy) pglimit.Strategy {
	if s == pglimit.Range {
		return pglimit.Upsert
	}
	return s
}

// itemKey carries a decoded POST /items body from createItem to the limiter
// and storeItem, so that the body is read once and a malformed one is
// refused before it consumes any of the user's limits.
type itemKey struct{}

func itemUser(r *http.Request) (string, error) {
	in, ok := r.Context().Value(itemKey{}).(itemRequest)
	if !ok {
		return "", errors.New("no decoded item") // unreachable: createItem sets it
	}
	return in.User, nil
}

// handler routes requests; every response is counted by route and status.
func (a *app) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /items", a.createItem)
	mux.Handle("GET /items/{user}", a.limit(http.HandlerFunc(a.listItems)))
	mux.Handle("GET /exports/{user}", a.export)
	mux.HandleFunc("GET /search/{org}/{user}", a.searchRoute)
	a.reports.routes(mux)
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}))
	return a.metrics.instrument(mux)
}

func (a *app) logDecision(r *http.Request, ev pglimithttp.Event) {
	switch ev.Outcome {
	case pglimithttp.OutcomeRefused:
		a.log.Debug("refused", "user", ev.Key, "retry_after", ev.Decision.RetryAfter)
	case pglimithttp.OutcomeBusy:
		a.log.Debug("every export slot held", "user", ev.Key)
	case pglimithttp.OutcomeBadKey:
		a.log.Info("bad key", "path", r.URL.Path, "err", ev.Err)
	case pglimithttp.OutcomeCanceled:
		// The client hung up while the limiter decided: not a failure.
		a.log.Debug("client gone before the decision", "user", ev.Key)
	case pglimithttp.OutcomeFailOpen, pglimithttp.OutcomeFailClosed, pglimithttp.OutcomeUnavailable:
		// Logged by the middleware, at a bounded rate; counted here.
		a.metrics.policy.WithLabelValues(string(ev.Outcome)).Inc()
	}
}

type itemRequest struct {
	User string `json:"user"`
	Name string `json:"name"`
}

func (a *app) createItem(w http.ResponseWriter, r *http.Request) {
	in, status, err := decodeItem(w, r)
	if err != nil {
		writeError(w, status, err.Error())
		return
	}
	a.create.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), itemKey{}, in)))
}

// exportOrg is an export's flow for the fleet's export slots: its
// organisation, the org query parameter, or else the user, an
// organisation of one; every organisation weighs the same.
func exportOrg(r *http.Request) (pglimitsem.Flow, error) {
	org := cmp.Or(r.URL.Query().Get("org"), r.PathValue("user"))
	return pglimitsem.Flow{Name: org, Weight: 1}, nil
}

// exportItems is a heavy job: it works for the configured export time,
// then writes the user's items as CSV. At most exportsAtOnce run at once
// per user.
func (a *app) exportItems(w http.ResponseWriter, r *http.Request) {
	select {
	case <-time.After(a.cfg.exportTime):
	case <-r.Context().Done():
		return
	}
	user := r.PathValue("user")
	items, err := a.items.list(r.Context(), user)
	if err != nil {
		a.serverError(w, r, "export items", err)
		return
	}
	w.Header().Set("Content-Type", "text/csv; charset=utf-8")
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"id", "user", "name", "created_at"})
	for _, it := range items {
		_ = cw.Write([]string{strconv.FormatInt(it.ID, 10), it.User, it.Name, it.CreatedAt.UTC().Format(time.RFC3339)})
	}
	cw.Flush()
}

// searchRoute refuses a search with a query it cannot run before the
// limits count it, and passes the others to them.
func (a *app) searchRoute(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query().Get("q")
	switch {
	case q == "" || len(q) > maxNameBytes:
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`"q" must be 1 to %d bytes`, maxNameBytes))
	case strings.IndexByte(q, 0) >= 0 || !utf8.ValidString(q):
		writeError(w, http.StatusBadRequest, `"q" must be UTF-8 text without NUL characters`)
	default:
		a.search.ServeHTTP(w, r)
	}
}

// searchItems finds the items whose name holds the query q, and reports
// how many it found, at least one, as the search's real cost.
func (a *app) searchItems(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query().Get("q")
	items, err := a.items.search(r.Context(), q)
	if err != nil {
		a.serverError(w, r, "search items", err)
		return
	}
	cost := max(len(items), 1)
	pglimithttp.SetCost(r.Context(), cost)
	writeJSON(w, http.StatusOK, struct {
		Query string `json:"query"`
		Cost  int    `json:"cost"`
		Items []item `json:"items"`
	}{q, cost, items})
}

// storeItem creates the item the limits admitted.
func (a *app) storeItem(w http.ResponseWriter, r *http.Request) {
	in := r.Context().Value(itemKey{}).(itemRequest)
	it, err := a.items.create(r.Context(), in.User, in.Name)
	if err != nil {
		a.serverError(w, r, "create item", err)
		return
	}
	a.metrics.itemEvent("created", it.User)
	w.Header().Set("Location", "/items/"+url.PathEscape(it.User))
	writeJSON(w, http.StatusCreated, it)
}

// decodeItem reads and validates the body of POST /items; on failure it
// returns the status to answer with.
func decodeItem(w http.ResponseWriter, r *http.Request) (itemRequest, int, error) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	var in itemRequest
	if err := dec.Decode(&in); err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return in, http.StatusRequestEntityTooLarge, fmt.Errorf("body larger than %d bytes", maxBodyBytes)
		}
		return in, http.StatusBadRequest, fmt.Errorf("body is not a JSON object {\"user\": ..., \"name\": ...}: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return in, http.StatusRequestEntityTooLarge, fmt.Errorf("body larger than %d bytes", maxBodyBytes)
		}
		return in, http.StatusBadRequest, errors.New("body holds more than one JSON value")
	}
	switch {
	case in.User == "":
		return in, http.StatusBadRequest, errors.New(`"user" is required`)
	case len(in.User) > maxUserBytes:
		return in, http.StatusBadRequest, fmt.Errorf(`"user" is longer than %d bytes`, maxUserBytes)
	case pglimit.ValidateKey(in.User) != nil:
		return in, http.StatusBadRequest, errors.New(`"user" must be text without NUL characters`)
	case in.Name == "":
		return in, http.StatusBadRequest, errors.New(`"name" is required`)
	case len(in.Name) > maxNameBytes:
		return in, http.StatusBadRequest, fmt.Errorf(`"name" is longer than %d bytes`, maxNameBytes)
	case strings.IndexByte(in.Name, 0) >= 0:
		return in, http.StatusBadRequest, errors.New(`"name" must be text without NUL characters`)
	}
	return in, 0, nil
}

func (a *app) listItems(w http.ResponseWriter, r *http.Request) {
	user := r.PathValue("user")
	items, err := a.items.list(r.Context(), user)
	if err != nil {
		a.serverError(w, r, "list items", err)
		return
	}
	a.metrics.itemEvent("listed", user)
	writeJSON(w, http.StatusOK, struct {
		User  string `json:"user"`
		Items []item `json:"items"`
	}{user, items})
}

func (a *app) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (a *app) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := a.pool.Ping(ctx); err != nil {
		a.log.Warn("not ready", "err", err)
		writeError(w, http.StatusServiceUnavailable, "database unreachable")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func (a *app) serverError(w http.ResponseWriter, r *http.Request, what string, err error) {
	a.log.Error(what, "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, what+" failed")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeBody(w, status, "application/json", v)
}

// writeError answers with an RFC 9457 problem, like the limiter middleware.
func writeError(w http.ResponseWriter, status int, detail string) {
	writeBody(w, status, "application/problem+json", struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{"about:blank", http.StatusText(status), status, detail})
}

func writeBody(w http.ResponseWriter, status int, contentType string, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encode response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

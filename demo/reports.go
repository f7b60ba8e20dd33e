package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
)

// A report is the demo's billed work: each organisation's plan allows
// reportsPerMonth a month from the day it signed up, and past that up to
// reportsHardCap, billed as overage; credits an operator grants come
// before the overage. Writing a report also spends model tokens, at most
// reportTokensPerHour an organisation: a report is admitted on an
// estimate and settled with what it spent when its worker reports back,
// by the report's id, on any instance. A retry of POST /orgs/{org}/reports
// with the same Idempotency-Key charges neither again.
const (
	reportTokensPerHour = 100_000
	reportTokenEstimate = 2_000
	maxReportTokens     = 1_000_000
	maxCreditUnits      = 1_000_000
	maxCreditLife       = 366 * 24 * time.Hour
)

// reports serves the plan, credits, reports and their settlement.
type reports struct {
	a      *app
	quota  *pglimitquota.Quota
	tokens pglimit.Limiter
}

func newReports(a *app, pool *pgxpool.Pool) (*reports, error) {
	quota, err := pglimitquota.New(pool, &pglimitquota.Config{
		Schema: a.cfg.schema, Namespace: "reports", Period: pglimitquota.Monthly,
		Allowance: int64(a.cfg.reportsPerMonth), HardCap: int64(a.cfg.reportsHardCap),
		Thresholds: []float64{0.8, 1},
	})
	if err != nil {
		return nil, fmt.Errorf("report quota: %w", err)
	}
	tokens, err := pglimit.New(pool, &pglimit.Config{
		Schema: a.cfg.schema, Namespace: "report-tokens",
		Limits: []pglimit.Limit{{Name: "tokens", Rate: reportTokensPerHour, Period: time.Hour, Burst: reportTokensPerHour, Debt: reportTokensPerHour / 2}},
	})
	if err != nil {
		return nil, fmt.Errorf("report tokens: %w", err)
	}
	return &reports{a: a, quota: quota, tokens: tokens}, nil
}

func (rs *reports) routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /orgs/{org}/plan", rs.signUp)
	mux.HandleFunc("POST /orgs/{org}/credits", rs.grant)
	mux.HandleFunc("GET /orgs/{org}/usage", rs.usage)
	mux.HandleFunc("POST /orgs/{org}/reports", rs.create)
	mux.HandleFunc("POST /reports/{id}/done", rs.done)
}

// usageJSON is a period's usage as the demo answers it.
type usageJSON struct {
	Used          int64     `json:"used"`
	FromAllowance int64     `json:"from_allowance"`
	FromCredits   int64     `json:"from_credits"`
	Overage       int64     `json:"overage"`
	Allowance     int64     `json:"allowance"`
	HardCap       int64     `json:"hard_cap"`
	CreditsLeft   int64     `json:"credits_left"`
	PeriodStart   time.Time `json:"period_start"`
	PeriodEnd     time.Time `json:"period_end"`
}

func usageOf(u pglimitquota.Usage) usageJSON {
	return usageJSON{u.Used, u.FromAllowance, u.FromCredits, u.Overage, u.Allowance, u.HardCap, u.CreditsLeft, u.PeriodStart, u.PeriodEnd}
}

// org is the organisation the path names, or a 400.
func (rs *reports) org(w http.ResponseWriter, r *http.Request) (string, bool) {
	org := r.PathValue("org")
	if len(org) > maxUserBytes || pglimit.ValidateKey(org) != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the organisation must be 1 to %d bytes of text without NUL characters", maxUserBytes))
		return "", false
	}
	return org, true
}

// decode reads a small JSON body into v; an empty body leaves v as it is.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("body is not the JSON object expected: %w", err)
	}
	return nil
}

// signUp puts the organisation on the plan from today, in the time zone
// the body names (UTC by default): its month runs from this day of the
// month, clamped to shorter months.
func (rs *reports) signUp(w http.ResponseWriter, r *http.Request) {
	org, ok := rs.org(w, r)
	if !ok {
		return
	}
	var in struct {
		TimeZone string `json:"time_zone"`
	}
	if err := decode(w, r, &in); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	zone := in.TimeZone
	if zone == "" {
		zone = "UTC"
	}
	loc, err := time.LoadLocation(zone)
	if err != nil || zone == "Local" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("time_zone %q is not an IANA zone name", zone))
		return
	}
	plan := pglimitquota.Plan{
		Anchor: pglimitquota.Anchor{Day: time.Now().In(loc).Day()}, TimeZone: zone,
		Allowance: int64(rs.a.cfg.reportsPerMonth), HardCap: int64(rs.a.cfg.reportsHardCap),
	}
	if _, err := rs.quota.SetPlan(r.Context(), org, plan, pglimitquota.AtOnce); err != nil {
		rs.failed(w, r, "set the plan", err)
		return
	}
	rs.usage(w, r)
}

// grant gives the organisation units of credit that expire.
func (rs *reports) grant(w http.ResponseWriter, r *http.Request) {
	org, ok := rs.org(w, r)
	if !ok {
		return
	}
	var in struct {
		Units     int64  `json:"units"`
		ExpiresIn string `json:"expires_in"`
	}
	if err := decode(w, r, &in); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	life, err := time.ParseDuration(in.ExpiresIn)
	switch {
	case in.Units <= 0 || in.Units > maxCreditUnits:
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`"units" must be from 1 to %d`, maxCreditUnits))
		return
	case err != nil || life <= 0 || life > maxCreditLife:
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`"expires_in" must be a duration such as "720h", up to %s`, maxCreditLife))
		return
	}
	if err := rs.quota.Grant(r.Context(), org, in.Units, time.Now().Add(life)); err != nil {
		rs.failed(w, r, "grant credits", err)
		return
	}
	rs.usage(w, r)
}

func (rs *reports) usage(w http.ResponseWriter, r *http.Request) {
	org, ok := rs.org(w, r)
	if !ok {
		return
	}
	u, err := rs.quota.Usage(r.Context(), org)
	if err != nil {
		rs.failed(w, r, "read the usage", err)
		return
	}
	writeJSON(w, http.StatusOK, usageOf(u))
}

// create admits a report: first its token estimate, then a unit of the
// plan, both under the report's id (its Idempotency-Key, or a new one).
// A report the plan refuses keeps its tokens for its retry, which the
// same key replays; without a key no retry comes, and it gives them back.
func (rs *reports) create(w http.ResponseWriter, r *http.Request) {
	org, ok := rs.org(w, r)
	if !ok {
		return
	}
	id, keyed, err := reportID(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ctx := pglimit.WithID(r.Context(), id)
	td, err := rs.tokens.AllowN(ctx, org, reportTokenEstimate)
	if err != nil {
		rs.failed(w, r, "charge the tokens", err)
		return
	}
	if !td.Allowed {
		w.Header().Set("Retry-After", strconv.Itoa(max(int(td.RetryAfter.Round(time.Second)/time.Second), 1)))
		writeError(w, http.StatusTooManyRequests, "the organisation's model tokens this hour are spent")
		return
	}
	qd, err := rs.quota.Allow(ctx, org, 1)
	if err == nil && !qd.Allowed && !keyed {
		_, err = pglimit.RefundID(ctx, rs.tokens, id, reportTokenEstimate)
	}
	switch {
	case err != nil:
		rs.failed(w, r, "charge the report", err)
	case !qd.Allowed:
		writeError(w, http.StatusTooManyRequests, fmt.Sprintf("the plan's %d reports this period, overage included, are used; the period ends at %s",
			qd.Usage.HardCap, qd.Usage.PeriodEnd.UTC().Format(time.RFC3339)))
	default:
		writeJSON(w, http.StatusCreated, struct {
			ID       string    `json:"id"`
			Replayed bool      `json:"replayed"`
			Overage  bool      `json:"overage"`
			Credit   bool      `json:"credit"`
			Usage    usageJSON `json:"usage"`
		}{id, qd.Replayed, qd.Overage > 0, qd.FromCredits > 0, usageOf(qd.Usage)})
	}
}

// reportID is the report's Idempotency-Key, which a retry repeats
// (keyed), or a new random id.
func reportID(r *http.Request) (id string, keyed bool, err error) {
	keys := r.Header.Values("Idempotency-Key")
	switch {
	case len(keys) > 1:
		return "", false, errors.New("the Idempotency-Key header is given more than once")
	case len(keys) == 1:
		if err := pglimit.ValidateID(keys[0]); err != nil {
			return "", false, fmt.Errorf("the Idempotency-Key header: %w", err)
		}
		return keys[0], true, nil
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "report-" + hex.EncodeToString(b[:]), false, nil
}

// done settles a report's tokens at what it spent, by its id, once.
func (rs *reports) done(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := pglimit.ValidateID(id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var in struct {
		Tokens int `json:"tokens"`
	}
	if err := decode(w, r, &in); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if in.Tokens < 0 || in.Tokens > maxReportTokens {
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`"tokens" must be from 0 to %d`, maxReportTokens))
		return
	}
	s, err := pglimit.SettleID(r.Context(), rs.tokens, id, in.Tokens)
	switch {
	case errors.Is(err, pglimit.ErrNotAdmitted):
		writeError(w, http.StatusNotFound, "no admitted report has this id")
	case errors.Is(err, pglimit.ErrAlreadySettled):
		writeError(w, http.StatusConflict, "the report was settled already")
	case err != nil:
		rs.failed(w, r, "settle the report", err)
	default:
		writeJSON(w, http.StatusOK, struct {
			ID       string `json:"id"`
			Charged  int    `json:"charged"`
			Returned int    `json:"returned"`
		}{id, s.Charged, s.Returned})
	}
}

// failed answers a failure of the quota or the limiter: a bad input is the
// client's (400), the rest the server's.
func (rs *reports) failed(w http.ResponseWriter, r *http.Request, what string, err error) {
	if errors.Is(err, pglimit.ErrInvalidConfig) || errors.Is(err, pglimit.ErrInvalidKey) || errors.Is(err, pglimit.ErrInvalidCost) || errors.Is(err, pglimit.ErrInvalidID) {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	rs.a.serverError(w, r, what, err)
}

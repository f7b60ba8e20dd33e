package pglimithttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
)

// levelsSetup is a middleware of two levels, an org (3 an hour) and its
// users (2 an hour), each request naming both in headers.
func levelsSetup(t *testing.T) (http.Handler, pglimit.Limiter, pglimit.Config) {
	t.Helper()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	orgCfg := pglimit.Config{Schema: schema, Namespace: "org", Limits: []pglimit.Limit{{Name: "org", Rate: 3, Period: time.Hour, Burst: 3}}}
	userCfg := pglimit.Config{Schema: schema, Namespace: "user", Limits: []pglimit.Limit{{Name: "user", Rate: 2, Period: time.Hour, Burst: 2}}}
	org, err := pglimit.New(pool, &orgCfg)
	if err != nil {
		t.Fatal(err)
	}
	user, err := pglimit.New(pool, &userCfg)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimithttp.Levels([]pglimithttp.Level{
		{Limiter: org, KeyFunc: pglimithttp.FromHeader("X-Org")},
		{Limiter: user, KeyFunc: pglimithttp.FromHeader("X-User")},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ds, ok := pglimithttp.DecisionsFrom(r.Context())
		if !ok || len(ds.Levels) != 2 {
			t.Errorf("DecisionsFrom in the handler: %+v, %t", ds, ok)
		}
	})), org, orgCfg
}

func levelsGet(h http.Handler, org, user string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("GET", "/", nil)
	if org != "" {
		req.Header.Set("X-Org", org)
	}
	req.Header.Set("X-User", user)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// A request passes only if its org and its user both admit it; a refusal
// names the level's limit that refused, and charges the other nothing.
func TestLevels(t *testing.T) {
	t.Parallel()
	h, _, orgCfg := levelsSetup(t)
	for range 2 {
		if rec := levelsGet(h, "acme", "bob"); rec.Code != http.StatusOK {
			t.Fatalf("bob: %d %s", rec.Code, rec.Body)
		}
	}
	rec := levelsGet(h, "acme", "bob")
	if p := decodeProblem(t, rec, http.StatusTooManyRequests); !slices.Equal(p.ViolatedPolicies, []string{"user"}) || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("bob past his limit: %+v, %v; want the user policy violated", p, rec.Header())
	}
	if st, err := pglimit.Inspect(context.Background(), testdb.Limiter(t, testdb.Pool(t), &orgCfg), "acme"); err != nil || st.Limits[0].Remaining != 1 {
		t.Fatalf("the org after bob's refusal: %+v, %v; want 1 left, nothing charged by the refusal", st, err)
	}
	rec = levelsGet(h, "acme", "carol")
	if rec.Code != http.StatusOK || !strings.Contains(rec.Header().Get("RateLimit-Policy"), `"org";q=3`) ||
		!strings.Contains(rec.Header().Get("RateLimit-Policy"), `"user";q=2`) || !strings.HasPrefix(rec.Header().Get("RateLimit"), `"org";r=0`) {
		t.Fatalf("carol, the org's last unit: %d %v; want both policies, the org binding with none left", rec.Code, rec.Header())
	}
	rec = levelsGet(h, "acme", "dave")
	if p := decodeProblem(t, rec, http.StatusTooManyRequests); !slices.Equal(p.ViolatedPolicies, []string{"org"}) {
		t.Errorf("dave in a spent org: %+v; want the org policy violated", p)
	}
	if rec := levelsGet(h, "", "erin"); rec.Code != http.StatusBadRequest {
		t.Errorf("a request without an org: %d, want 400", rec.Code)
	}
}

// Levels refuses what it cannot tell apart or use.
func TestLevelsConfig(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	a, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "a", Limits: []pglimit.Limit{{Name: "rate", Rate: 3, Period: time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "b", Limits: []pglimit.Limit{{Name: "rate", Rate: 3, Period: time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	key := pglimithttp.FromHeader("X-Key")
	for name, c := range map[string]struct {
		levels []pglimithttp.Level
		cfg    *pglimithttp.Config
	}{
		"no levels":       {nil, nil},
		"one name twice":  {[]pglimithttp.Level{{Limiter: a, KeyFunc: key}, {Limiter: b, KeyFunc: key}}, nil},
		"no KeyFunc":      {[]pglimithttp.Level{{Limiter: a}}, nil},
		"Config.KeyFunc":  {[]pglimithttp.Level{{Limiter: a, KeyFunc: key}}, &pglimithttp.Config{KeyFunc: key}},
		"Config.MaxDelay": {[]pglimithttp.Level{{Limiter: a, KeyFunc: key}}, &pglimithttp.Config{MaxDelay: time.Second}},
		"a nil Limiter":   {[]pglimithttp.Level{{KeyFunc: key}}, nil},
	} {
		if _, err := pglimithttp.Levels(c.levels, c.cfg); !errors.Is(err, pglimithttp.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// A 429 names the namespace of each limiter that refused, in its problem
// body, so that the person on call finds the limiter's recorded policy
// (pglimit.RecordedPolicies, the pglimit command) without the code.
func TestRefusalNamesNamespace(t *testing.T) {
	t.Parallel()
	type body struct {
		Detail     string   `json:"detail"`
		Namespaces []string `json:"namespaces"`
	}
	read := func(t *testing.T, rec *httptest.ResponseRecorder) body {
		t.Helper()
		var b body
		if rec.Code != http.StatusTooManyRequests {
			t.Fatalf("status %d, want 429", rec.Code)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
			t.Fatal(err)
		}
		return b
	}

	h, _, _ := levelsSetup(t)
	for range 2 {
		levelsGet(h, "acme", "alice")
	}
	b := read(t, levelsGet(h, "acme", "alice")) // alice's 2 an hour are spent
	if !slices.Equal(b.Namespaces, []string{"user"}) || !strings.Contains(b.Detail, `namespace "user"`) {
		t.Errorf("Levels' 429: %+v; want the user level's namespace, in namespaces and detail", b)
	}

	lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: testdb.Schema(t), Namespace: "partner-export", Cooldown: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimithttp.Middleware(lim, &pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-User")})
	if err != nil {
		t.Fatal(err)
	}
	h = mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	levelsGet(h, "", "bob")
	b = read(t, levelsGet(h, "", "bob"))
	if !slices.Equal(b.Namespaces, []string{"partner-export"}) || !strings.Contains(b.Detail, `namespace "partner-export"`) {
		t.Errorf("Middleware's 429: %+v; want its namespace, in namespaces and detail", b)
	}
}

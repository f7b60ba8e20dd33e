package pglimithttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// The RateLimit fields follow draft-ietf-httpapi-ratelimit-headers-11
// (May 2026), which made them Structured Fields (RFC 9651) Lists of Items:
//
//	RateLimit-Policy: "<name>";q=<quota>;w=<window seconds>, ...
//	RateLimit:        "<name>";r=<remaining>;t=<seconds until reset>
//
// Every limit is one policy: q is its Rate, w its Period. Both fields are
// Lists: middlewares stacked on a request each add their policies, and
// each admitting one its RateLimit item (stack.go). The draft has no
// parameter for a burst (q, qu, w and pk only), so a GCRA limit's burst is
// not advertised; a client that paces itself by q and w stays within it.
// The same draft defines the quota-exceeded problem type used in the 429
// body, with its violated-policies member.
const quotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// validatePolicy accepts names that fit an sf-string: printable ASCII, at
// most 64 bytes.
func validatePolicy(name string) error {
	if name == "" || len(name) > maxPolicyBytes {
		return fmt.Errorf("%q: must be 1 to %d bytes", name, maxPolicyBytes)
	}
	for i := range len(name) {
		if c := name[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("byte %#x at %d is not printable ASCII", c, i)
		}
	}
	return nil
}

const maxPolicyBytes = 64

// quoteString serializes a validated name as an sf-string (RFC 9651
// §4.1.6): in double quotes, with '"' and '\' escaped.
func quoteString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := range len(s) {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}

// formatPolicy is the RateLimit-Policy value: one item per limit, Rate per
// Period. The draft's window is a whole number of seconds, at least 1, so a
// period is advertised rounded up (a client that honours it goes slower than
// it may, never faster).
func formatPolicy(limits []pglimit.Limit) string {
	var b strings.Builder
	for i, l := range limits {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(quoteString(l.Name))
		b.WriteString(";q=")
		b.WriteString(strconv.Itoa(l.Rate))
		b.WriteString(";w=")
		b.WriteString(formatSeconds(retryAfterSeconds(l.Period)))
	}
	return b.String()
}

// formatRateLimit is the RateLimit value: the binding limit's remaining
// units and the seconds until it is back to full.
func formatRateLimit(name string, remaining int, reset int64) string {
	return quoteString(name) + ";r=" + strconv.Itoa(max(remaining, 0)) + ";t=" + formatSeconds(reset)
}

// ceilSeconds rounds d up to whole seconds; zero or negative gives 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// retryAfterSeconds is the Retry-After value for a wait of d: rounded up, so
// a client never comes back early, and at least 1, since "Retry-After: 0"
// invites an immediate retry that would be refused again.
func retryAfterSeconds(d time.Duration) int64 {
	return max(1, ceilSeconds(d))
}

func formatSeconds(s int64) string { return strconv.FormatInt(s, 10) }

// problem is an RFC 9457 problem details object.
type problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail,omitempty"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	// Namespaces, an extension member (RFC 9457 §3.2), names the
	// namespaces of the limiters that refused.
	Namespaces []string `json:"namespaces,omitempty"`
}

func writeProblem(w http.ResponseWriter, status int, p problem) {
	if p.Type == "" {
		p.Type = "about:blank" // RFC 9457 §4.2.1: the status code says it all
	}
	p.Status = status
	body, err := json.Marshal(p)
	if err != nil {
		// Unreachable: the struct holds only strings and ints.
		body = []byte(`{"type":"about:blank","status":` + strconv.Itoa(status) + `}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

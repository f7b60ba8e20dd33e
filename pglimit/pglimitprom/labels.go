package pglimitprom

import (
	"sync"
	"unicode/utf8"
)

// CappedLabel bounds the values of a label that would otherwise be
// unbounded, such as a user id: the first Max distinct values pass through,
// later ones become [OtherKey]. Applications can use it for their own
// per-user metrics. It is safe for concurrent use.
type CappedLabel struct {
	max  int
	mu   sync.Mutex
	seen map[string]struct{}
}

// NewCappedLabel returns a CappedLabel that lets max distinct values through.
func NewCappedLabel(max int) *CappedLabel {
	return &CappedLabel{max: max, seen: make(map[string]struct{}, max)}
}

// Value returns v if it is one of the first max distinct values seen, else
// "other". Values that are not valid UTF-8, which Prometheus rejects, are
// "other" too.
func (c *CappedLabel) Value(v string) string {
	if !utf8.ValidString(v) {
		return OtherKey
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[v]; ok {
		return v
	}
	if len(c.seen) >= c.max {
		return OtherKey
	}
	c.seen[v] = struct{}{}
	return v
}

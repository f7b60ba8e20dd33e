package pglimithealth

// LockKey is the advisory lock t's election holds while it leads.
func LockKey(t *Throttle) int64 { return t.lockKey }

package pglimithttp

// PausedKeys is how many keys t holds back in this process, ended pauses
// not yet dropped included.
func PausedKeys(t *Transport) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.paused)
}

package pglimitsem

// WaitingKeys is how many keys s keeps a wake channel for: keys with a
// caller of Wait in this process.
func WaitingKeys(s *Semaphore) int {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	return len(s.wake)
}

// Leaving is how many removals of joins cut off s has under way.
func Leaving(s *Semaphore) int64 { return s.leaving.Load() }

package pglimitsem

// WaitingKeys is how many keys s keeps a wake channel for: keys with a
// caller of Wait in this process.
func WaitingKeys(s *Semaphore) int {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	return len(s.wake)
}

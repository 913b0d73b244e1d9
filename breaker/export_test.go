package breaker

// Len returns how many topics b holds state for.
func Len(b *Topics) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.topics)
}

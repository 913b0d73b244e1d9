// Package alerttest holds an alert.Alerter that keeps what it gets, for tests.
package alerttest

import (
	"context"
	"slices"
	"sync"

	"github.com/outbox-sweeper/sweeper/alert"
)

// Recorder keeps every alert it gets, in order. Its zero value is ready.
type Recorder struct {
	mu  sync.Mutex
	got []alert.Alert
}

// Alert keeps a.
func (r *Recorder) Alert(_ context.Context, a alert.Alert) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, a)
	return nil
}

// All returns the alerts so far.
func (r *Recorder) All() []alert.Alert {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// Of returns the alerts so far of component.
func (r *Recorder) Of(component string) []alert.Alert {
	var out []alert.Alert
	for _, a := range r.All() {
		if a.Component == component {
			out = append(out, a)
		}
	}
	return out
}

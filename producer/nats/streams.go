package nats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outbox-sweeper/sweeper/producer"
)

// Defaults for the stream list (see Config.StreamsRefresh).
const (
	StreamsRefreshDefault = 30 * time.Second
	// streamsMissRefresh is how soon after a read a subject no cached stream
	// captures makes the list be read again: a stream created a moment ago
	// is seen within it, and a flood of such subjects costs one read a
	// second, not one per subject.
	streamsMissRefresh = time.Second
	// streamsReadTimeout bounds one read of the list.
	streamsReadTimeout = 5 * time.Second
)

// streams caches the subjects the account's streams capture, so that a
// subject none captures is refused before anything is published. Without it
// each such publish waits for JetStream to say there is no stream (about half
// a second, with the client's retries on "no responders"), and a flood of
// rows with such subjects (an application writing an id as the topic) takes
// the sweeper's every slot and starves the topics that work.
//
// The list is read on first use, again after refresh, and again on a miss
// once streamsMissRefresh has passed since the last read. A list that cannot
// be read (no permission for $JS.API.STREAM.LIST, say) refuses nothing: the
// publish decides, as before.
type streams struct {
	refresh time.Duration // <0: off
	now     func() time.Time

	reading chan struct{} // one read at a time: a slot, so waiting heeds ctx
	mu      sync.Mutex
	filters [][]string // each stream subject, cut into tokens
	readAt  time.Time  // zero: never read
	ok      bool       // the last read succeeded
}

func newStreams(refresh time.Duration) *streams {
	if refresh == 0 {
		refresh = StreamsRefreshDefault
	}
	return &streams{refresh: refresh, now: time.Now, reading: make(chan struct{}, 1)}
}

// check returns a topic-class error when no stream captures subject, as far
// as the list read last (and read again if stale, or on a miss) says. It
// returns nil when a stream captures it or when it cannot tell.
func (s *streams) check(ctx context.Context, js jetstream.JetStream, subject string) error {
	if s.refresh < 0 || js == nil {
		return nil
	}
	captured, known, fresh := s.lookup(subject)
	if known && (captured && fresh) {
		return nil
	}
	if !fresh || !captured {
		s.read(ctx, js, captured && known)
		captured, known, _ = s.lookup(subject)
	}
	if !known || captured {
		return nil
	}
	// The text stays the same from one refusal to the next: the sweeper
	// writes it on a row only when it changes.
	return producer.NewTopicError("no_stream", fmt.Errorf(
		"publish to subject %q: no JetStream stream captures it, says the stream list (create a stream whose subjects include this one)", subject))
}

// lookup says whether the cached list captures subject, whether there is a
// list to tell (known), and whether it is younger than refresh.
func (s *streams) lookup(subject string) (captured, known, fresh bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ok {
		return false, false, s.now().Sub(s.readAt) < streamsMissRefresh
	}
	fresh = s.now().Sub(s.readAt) < s.refresh
	tokens := strings.Split(subject, ".")
	for _, f := range s.filters {
		if matches(f, tokens) {
			return true, true, fresh
		}
	}
	return false, true, fresh
}

// read reads the list again, unless another read is under way (then it waits
// for that one) or the list is younger than streamsMissRefresh (a miss) or
// refresh (stale is set: the subject was captured, the list only old).
func (s *streams) read(ctx context.Context, js jetstream.JetStream, stale bool) {
	select {
	case s.reading <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-s.reading }()
	s.mu.Lock()
	age := s.now().Sub(s.readAt)
	s.mu.Unlock()
	if age < streamsMissRefresh || (stale && age < s.refresh) {
		return // read meanwhile
	}
	ctx, cancel := context.WithTimeout(ctx, streamsReadTimeout)
	defer cancel()
	var filters [][]string
	l := js.ListStreams(ctx)
	for info := range l.Info() {
		for _, subj := range info.Config.Subjects {
			filters = append(filters, strings.Split(subj, "."))
		}
	}
	err := l.Err()
	if errors.Is(ctx.Err(), context.Canceled) {
		return // the send ended: neither the list nor its absence is news
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readAt = s.now()
	if err != nil {
		// Keep a list read before: a stream deleted since is the publish's to
		// find. Without one, refuse nothing.
		return
	}
	s.filters, s.ok = filters, true
}

// matches reports whether a stream subject (tokens of a filter, with * for one
// token and > for one or more at the end) captures a literal subject.
func matches(filter, subject []string) bool {
	for i, f := range filter {
		if f == ">" {
			return len(subject) > i
		}
		if i >= len(subject) || (f != "*" && f != subject[i]) {
			return false
		}
	}
	return len(filter) == len(subject)
}

package outbox

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
)

// TestDecide is the failure policy's table: every class, with and without rows
// named, one row or several, each state of the evidence, ordered or not, and
// the attempt that reaches --max-attempts.
func TestDecide(t *testing.T) {
	t.Parallel()
	const (
		transient = producer.ClassTransient
		topic     = producer.ClassTopic
		message   = producer.ClassMessage
		local     = producer.ClassLocal
		brk       = producer.ClassBroker
	)
	up, down, unknown := breaker.BrokerUp, breaker.BrokerDown, breaker.VerdictUnknown
	for _, tc := range []struct {
		name string
		f    failure
		want action
	}{
		// Nobody's fault.
		{"local: stopping or closed", failure{class: local, rows: 5, broker: brokerUp},
			action{release: true, stopTopic: true, broker: unknown}},
		// The broker's.
		{"connection refused, reset, closed", failure{class: brk, rows: 5, broker: brokerUp},
			action{release: true, stopTopic: true, backoff: true, broker: down}},
		{"connection failure of one row already failing", failure{class: brk, rows: 1, attempts: 9, maxAttempts: 10, broker: brokerUp},
			action{release: true, stopTopic: true, backoff: true, broker: down}},
		{"transient, nothing known yet: ask the check", failure{class: transient, rows: 5},
			action{check: true}},
		{"transient, one row, nothing known yet: ask the check", failure{class: transient, rows: 1},
			action{check: true}},
		{"transient, check failed", failure{class: transient, rows: 5, broker: brokerDown},
			action{release: true, stopTopic: true, backoff: true, broker: down}},
		{"transient, one row, check failed: never the row's", failure{class: transient, rows: 1, attempts: 9, maxAttempts: 10, broker: brokerDown},
			action{release: true, stopTopic: true, backoff: true, broker: down}},
		// The topic's.
		{"topic class: trip at once, rows untouched", failure{class: topic, rows: 5},
			action{release: true, note: true, stopTopic: true, tripTopic: true, broker: up}},
		// The rows'.
		{"message class naming rows", failure{class: message, rows: 5, named: 2},
			action{deadLetterNamed: true, resendRest: true, broker: up}},
		{"message class naming the one row", failure{class: message, rows: 1, named: 1},
			action{deadLetterNamed: true, resendRest: true, broker: up}},
		{"message class naming none, one row: pinned on it", failure{class: message, rows: 1},
			action{deadLetterNamed: true, broker: up}},
		{"message class naming none of several, nothing known", failure{class: message, rows: 5},
			action{check: true}},
		{"message class naming none of several, broker up: split", failure{class: message, rows: 5, broker: brokerUp},
			action{split: true, broker: up}},
		{"transient, several rows, broker up: split", failure{class: transient, rows: 2, broker: brokerUp},
			action{split: true, broker: up}},
		{"transient, one row alone, broker up: an attempt", failure{class: transient, rows: 1, maxAttempts: 10, broker: brokerUp},
			action{attempt: true, broker: up}},
		{"… ordered: the topic waits behind it", failure{class: transient, rows: 1, maxAttempts: 10, broker: brokerUp, ordered: true},
			action{attempt: true, stopTopic: true, backoff: true, broker: up}},
		{"… the attempt that reaches --max-attempts", failure{class: transient, rows: 1, attempts: 9, maxAttempts: 10, broker: brokerUp},
			action{attempt: true, exhausted: true, broker: up}},
		{"… past it (a lowered --max-attempts)", failure{class: transient, rows: 1, attempts: 30, maxAttempts: 10, broker: brokerUp},
			action{attempt: true, exhausted: true, broker: up}},
		{"… --max-attempts -1 keeps rows forever", failure{class: transient, rows: 1, attempts: 1000, maxAttempts: 0, broker: brokerUp},
			action{attempt: true, broker: up}},
		// Partial success: the broker took some rows of the send before it
		// failed (they are moved as sent before decide); the rest are judged,
		// and the broker is known to be up.
		{"delivered, then a transient failure of several: split, no check", failure{class: transient, rows: 3, delivered: 4},
			action{split: true, broker: up}},
		{"delivered, then one row failed: its attempt", failure{class: transient, rows: 1, delivered: 9, maxAttempts: 10},
			action{attempt: true, broker: up}},
		{"delivered, then a row refused by name: the rest goes on", failure{class: message, rows: 6, named: 1, delivered: 3},
			action{deadLetterNamed: true, resendRest: true, broker: up}},
		{"delivered, then the connection dropped: the broker's", failure{class: brk, rows: 5, delivered: 5},
			action{release: true, stopTopic: true, backoff: true, broker: down}},
		{"delivered, then the check failed: the broker's", failure{class: transient, rows: 5, delivered: 5, broker: brokerDown},
			action{release: true, stopTopic: true, backoff: true, broker: down}},
		// Cutting, before any send: no verdict on the broker unless the
		// producer could not reach it.
		{"cut: rows over a limit", failure{cut: true, class: message, rows: 5, named: 1},
			action{deadLetterNamed: true, resendRest: true}},
		{"cut: one row refused unnamed", failure{cut: true, class: message, rows: 1},
			action{deadLetterNamed: true}},
		{"cut: several refused unnamed: cut the halves", failure{cut: true, class: message, rows: 5},
			action{split: true}},
		{"cut: invalid topic", failure{cut: true, class: topic, rows: 5},
			action{release: true, note: true, stopTopic: true, tripTopic: true}},
		{"cut: broker unreachable", failure{cut: true, class: brk, rows: 5},
			action{release: true, stopTopic: true, backoff: true, broker: down}},
		{"cut: transient", failure{cut: true, class: transient, rows: 5},
			action{release: true, stopTopic: true, backoff: true, broker: down}},
		{"cut: local", failure{cut: true, class: local, rows: 5},
			action{release: true, stopTopic: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, decide(tc.f))
		})
	}
}

// The storm guard turns dead letters into a tripped topic; an attempt is still
// counted, and rows not charged go back.
func TestStormed(t *testing.T) {
	t.Parallel()
	require.Equal(t, action{release: true, stopTopic: true, tripTopic: true, broker: breaker.BrokerUp},
		action{deadLetterNamed: true, resendRest: true, broker: breaker.BrokerUp}.stormed())
	require.Equal(t, action{attempt: true, stopTopic: true, tripTopic: true, backoff: true, broker: breaker.BrokerUp},
		action{attempt: true, exhausted: true, backoff: true, broker: breaker.BrokerUp}.stormed())
}

func TestBlameTopicAfterSplit(t *testing.T) {
	t.Parallel()
	require.True(t, blameTopicAfterSplit(8, 0, 8), "every row failed alone")
	require.False(t, blameTopicAfterSplit(8, 7, 1), "one bad row among good ones")
	require.False(t, blameTopicAfterSplit(8, 0, 1), "ordered: stopped at the first bad row")
	require.False(t, blameTopicAfterSplit(1, 0, 1), "a row alone is the row's")
	require.False(t, blameTopicAfterSplit(3, 0, 3), "three bad rows side by side are rows")
	require.True(t, blameTopicAfterSplit(4, 0, 4))
	require.False(t, blameTopicAfterSplit(8, 0, 6), "some refused as messages")
}

// The backoff doubles from the first wait to the cap, draws each wait in its
// upper half, and a success ends it.
func TestTopicBackoff(t *testing.T) {
	t.Parallel()
	for _, r := range []float64{0, 0.5, 0.999} {
		b := newTopicBackoff(100, 1000, func() float64 { return r })
		now := time.Unix(1e9, 0)
		want := []int64{100, 200, 400, 800, 1000, 1000}
		for _, d := range want {
			w := b.failed("a", now)
			require.GreaterOrEqual(t, int64(w), d/2)
			require.Less(t, int64(w), max(d, 1))
			require.Equal(t, []string{"a"}, b.waiting(now))
			require.Empty(t, b.waiting(now.Add(w)))
		}
		require.Equal(t, 6, b.list()[0].Failures)
		b.succeeded("a")
		require.Empty(t, b.list())
		require.EqualValues(t, 50+int64(r*50), b.failed("a", now), "the sequence starts over")
	}
	off := newTopicBackoff(100, -1, nil)
	require.Zero(t, off.failed("a", time.Unix(1e9, 0)))
	require.Empty(t, off.waiting(time.Unix(1e9, 0)))
}

// A topic not tried again within the longest wait after its wait ended had
// nothing more to send: it is forgotten, so that a topic per row leaves no
// entry per topic behind.
func TestTopicBackoffForgetsTopicsNotTriedAgain(t *testing.T) {
	t.Parallel()
	b := newTopicBackoff(100, 1000, func() float64 { return 0 })
	now := time.Unix(1e9, 0)
	for i := range 1000 {
		b.failed(fmt.Sprint(i), now)
	}
	require.Len(t, b.waiting(now), 1000)
	require.Empty(t, b.waiting(now.Add(1000)))
	require.Len(t, b.list(), 1000, "a wait just over is kept: its topic is tried at the next sweep")
	require.Empty(t, b.waiting(now.Add(1051)))
	require.Empty(t, b.list())
}

func TestTopicBackoffOff(t *testing.T) {
	t.Parallel()
	off := newTopicBackoff(100, -1, nil)
	require.Empty(t, off.waiting(time.Unix(1e9, 0)))
}

func TestLogTextBoundsRowText(t *testing.T) {
	t.Parallel()
	require.Equal(t, "orders", logText("orders"))
	long := logText(string(make([]byte, 10_000)))
	require.Less(t, len(long), 230)
	require.Contains(t, long, "(10000 bytes)")
	require.True(t, utf8.ValidString(logText(strings.Repeat("é", 150))), "cut at a rune boundary")
}

package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
)

// LogTopicStateChange returns a breaker.Settings.OnStateChange hook that logs
// every change of a topic's state: a trip as a warning, unless an operator
// made it, the rest as info.
func LogTopicStateChange(logger *slog.Logger) func(topic string, from, to breaker.State, reason string) {
	return func(topic string, from, to breaker.State, reason string) {
		level := slog.LevelInfo
		if to == breaker.StateTripped && !breaker.ByOperator(reason) {
			level = slog.LevelWarn
		}
		logger.Log(context.Background(), level, "topic breaker: "+to.String(),
			"topic", logText(topic), "from", from.String(), "to", to.String(), "reason", reason)
	}
}

// Observer is told what the sweeper does; the metrics package implements it.
// Its methods are called from the sweep's goroutines and must be quick.
type Observer interface {
	// BatchDispatched reports a batch the broker accepted, with each message's
	// time from the application's write to the broker's acceptance.
	BatchDispatched(topic string, size int, latencies []time.Duration)
	// BatchFailed reports a failed batch and its failure class.
	BatchFailed(topic string, class producer.Class)
	// DeadLettered reports rows moved to the dead-letter table.
	DeadLettered(topic string, n int)
	// SweepDone reports a tick's sweep and how long it took.
	SweepDone(d time.Duration)
}

// SendObserver is an Observer that also wants each call of the producer and
// each retry within a send. The metrics package implements it.
type SendObserver interface {
	Observer
	// BatchSent reports one call of the producer's Send for a batch of size
	// rows of topic: how long it took and its error (nil: accepted).
	BatchSent(topic string, size int, d time.Duration, err error)
	// SendRetried reports a failed call about to be tried again within the
	// same send (--retry-attempts), with the failure's class.
	SendRetried(topic string, class producer.Class)
}

// Causes of ResendObserver.Resent.
const (
	// ResendUnknownOutcome: a send failed in a way that may have delivered
	// its rows (a timeout, a connection lost after the request went, a
	// cancelled send), and the producer did not say which arrived.
	ResendUnknownOutcome = "unknown_outcome"
	// ResendRolledBack: the broker took the rows, and their page's
	// transaction rolled back (a database error, a failed commit) before
	// it moved them.
	ResendRolledBack = "rolled_back"
)

// ResendObserver is an Observer that also wants the rows the sweeper sends,
// or will send, a second time after the broker may have taken them: the
// duplicates the sweeper knows of (a process killed mid-page leaves others
// that no one counts). The metrics package implements it.
type ResendObserver interface {
	Observer
	// Resent reports n rows of topic sent again, or left to be, for cause
	// (ResendUnknownOutcome, ResendRolledBack).
	Resent(topic, cause string, n int)
}

// ListenObserver is an Observer that also wants to know whether the sweeper's
// listen connection (wake-up on commit) is up. The metrics package implements it.
type ListenObserver interface {
	Observer
	// Listening reports the connection up (true) or down (false).
	Listening(up bool)
}

// SweepFailuresObserver is an Observer that also wants to know how many
// sweeps have failed in a row (the metrics package implements it).
type SweepFailuresObserver interface {
	Observer
	// SweepsFailing reports n sweeps failed in a row; 0 once one succeeds.
	SweepsFailing(n int)
}

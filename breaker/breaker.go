package breaker

import (
	"strings"
	"unicode/utf8"
)

// Breaker is what the sweeper needs of a per-topic breaker, and what operators
// use to steer it. [Topics] keeps the state in memory, [Redis] shares it among
// sweeper instances.
//
// No method returns an error: a breaker whose store is unreachable falls back
// to what it knows locally, since a breaker must never become a reason to stop
// relaying.
type Breaker interface {
	// OnTick advances the cooldowns by one tick. The sweeper calls it at the
	// start of every tick.
	OnTick()
	// Plan says which topics the sweep leaves out and which it tries once.
	Plan() Plan
	// Success and Failure report a batch's outcome with the topic's generation
	// from the plan the batch was sent under.
	Success(topic string, gen uint64)
	Failure(topic string, gen uint64, topicClass bool, errText string)
	// Trip and Reset are the operator's: trip a topic for its cooldown, or close
	// it at once.
	Trip(topic, reason string)
	Reset(topic string)
	// Tripped lists the topics that are not closed; State tells one topic's.
	Tripped() []TopicStatus
	State(topic string) State
}

var _ Breaker = (*Topics)(nil)

// Emptier is a Breaker that closes a half-open topic with no row left to try
// as such, rather than as a trial that succeeded (Success).
type Emptier interface {
	Empty(topic string, gen uint64)
}

var (
	_ Emptier = (*Topics)(nil)
	_ Emptier = (*Redis)(nil)
)

// TripCounter is a Breaker that counts the trips it makes. A sweep takes its
// plan once, at its start, and pages on with it, past its tick while a drain
// lasts; without a count, a topic tripped meanwhile (by an operator, or, in
// the state shared through Redis, by this instance's failures adding to
// others') would go on sending until the sweep ended. The sweep reads the count before each page and each batch, an
// atomic load, and asks Tripped again only when it has moved.
type TripCounter interface {
	// Trips is a count that moves at every trip the breaker makes, of any
	// topic and for any reason, and at nothing else. It only grows. A
	// Topics moves it once a trip; a Redis once or twice for a trip made
	// through it (its local shadow's, if the shadow trips too, and once the
	// shared state holds it, while Redis answers).
	Trips() uint64
}

var (
	_ TripCounter = (*Topics)(nil)
	_ TripCounter = (*Redis)(nil)
)

// The reasons of changes an operator makes by hand (Trip, Reset) begin with
// these, so that a deliberate change logs and alerts lower than one the
// breaker made by itself.
const (
	trippedByOperator = "tripped by an operator"
	resetByOperator   = "reset by an operator"
)

// ByOperator reports whether reason, as OnStateChange receives it, is of a
// change an operator made by hand rather than one the breaker made.
func ByOperator(reason string) bool {
	return strings.HasPrefix(reason, trippedByOperator) || strings.HasPrefix(reason, resetByOperator)
}

// cause shortens a failure's text for a trip's reason: its first line, cut at
// 200 bytes on a rune boundary. The reason travels to logs and alerts, and
// errText holds no payload (Failure's contract).
func cause(errText string) string {
	if i := strings.IndexByte(errText, '\n'); i >= 0 {
		errText = errText[:i]
	}
	if len(errText) <= 200 {
		return errText
	}
	cut := 200
	for cut > 0 && !utf8.RuneStart(errText[cut]) {
		cut--
	}
	return errText[:cut] + "…"
}

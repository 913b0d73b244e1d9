package outbox

import (
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
)

// This file holds the failure policy: the one place that says what a failed
// send means for its rows, its topic and the broker. The topic sender gathers
// what it knows into a [failure], asks [decide], and hands the [action] to
// execute (execute.go), which carries it out and records it in the page's
// transaction. Nothing else judges a failure, and nothing else acts on one.
//
// The rules, as docs/concepts.md gives them ("Who is to blame: the broker,
// the topic or the row"):
//   - A row is blamed (an attempt, and at --max-attempts a dead letter) only when
//     it failed alone while the broker is known to be up: another send of the
//     sweep succeeded, or the producer's health check passed right after. A
//     batch that fails without naming rows is split in halves until the failing
//     rows stand alone, so a good neighbour never gains an attempt.
//   - A row the broker refuses for what it is (message class) is dead-lettered
//     at once with its own reason; its neighbours are sent at once.
//   - The broker is blamed (no attempts, no dead letters; the broker breaker
//     counts) when the connection fails, or when a failure comes while the
//     broker cannot be shown to be up. A long outage never dead-letters anything.
//   - The topic is blamed when its destination is wrong whatever the message
//     (topic class): it trips at once and its rows keep their attempts.

// evidence is what the sweeper knows of the broker's health when a send fails.
type evidence int

const (
	// brokerUnknown: no send of the sweep has succeeded and no check was made.
	brokerUnknown evidence = iota
	// brokerUp: a send of the sweep succeeded, or the producer's check passed
	// after the failure.
	brokerUp
	// brokerDown: the producer's check failed too, or the producer has none.
	brokerDown
)

func (e evidence) String() string {
	switch e {
	case brokerUp:
		return "up"
	case brokerDown:
		return "down"
	default:
		return "unknown"
	}
}

// failure is a failed send (or a failed cut) as the policy sees it.
type failure struct {
	// class is the producer's class for the failure.
	class producer.Class
	// rows is how many rows the send carried, less those delivered.
	rows int
	// delivered counts the rows of the send the broker took before it
	// failed (producer.Delivered); rows counts the others, the failure's.
	delivered int
	// named counts the rows of the send a message-class error names.
	named int
	// attempts is the row's attempts before this send, when rows is 1.
	attempts int
	// maxAttempts is --max-attempts; 0 keeps rows forever.
	maxAttempts int
	// broker is what is known of the broker's health.
	broker evidence
	// ordered is set under OrderingTopic: a row that fails stops its topic, so
	// that nothing behind it overtakes it.
	ordered bool
	// cut says the producer failed to cut the topic's rows into batches:
	// nothing was sent.
	cut bool
}

// action is what the sweeper and the store do about a failure. The zero value
// releases the rows as they were and goes on.
type action struct {
	// check: ask the producer's health check, then decide again with its
	// answer as the evidence. The rows stay claimed meanwhile.
	check bool
	// Rows.
	//
	// release: every row goes back outstanding as it was, without an attempt.
	release bool
	// attempt: the send's one row counts an attempt and keeps the error.
	attempt bool
	// deadLetter: rows leave the outbox now. deadLetterNamed takes the rows
	// the error names, each with its own reason (producer.RowReason);
	// exhausted takes the send's one row, whose attempt reached --max-attempts,
	// with reason max_retries_exceeded. The store weighs either against the
	// storm guard first.
	deadLetterNamed, exhausted bool
	// note: the released rows keep the error as their last_error, without an
	// attempt, so an operator looking at them sees why they wait.
	note bool
	// resendRest: the rows the error did not name go on at once.
	resendRest bool
	// split: send the rows again as two halves, each judged on its own.
	split bool
	// Topic.
	//
	// stopTopic: the topic sends nothing more in this sweep.
	stopTopic bool
	// tripTopic: trip the topic breaker at once (topic class).
	tripTopic bool
	// backoff: the topic waits before its next try (see topicBackoff).
	backoff bool
	// Broker: the verdict for the broker breaker.
	broker breaker.Verdict
}

// decide is the failure policy. It is pure: the same failure always gets the
// same action, and TestDecide lists every case.
func decide(f failure) action {
	if f.cut {
		return decideCut(f)
	}
	if f.delivered > 0 && f.broker == brokerUnknown && f.class != producer.ClassBroker {
		// The broker took rows of this very send: it is up, and the rest
		// failed for reasons of their own (their topic, or themselves).
		f.broker = brokerUp
	}
	switch f.class {
	case producer.ClassLocal:
		// The sweeper is stopping or the producer is closed: nothing was
		// learnt about anything.
		return action{release: true, stopTopic: true, broker: breaker.VerdictUnknown}
	case producer.ClassBroker:
		// The connection failed: whatever the rows hold, they never reached
		// the broker.
		return action{release: true, stopTopic: true, backoff: true, broker: breaker.BrokerDown}
	case producer.ClassTopic:
		return action{release: true, note: true, stopTopic: true, tripTopic: true, broker: breaker.BrokerUp}
	case producer.ClassMessage:
		if f.named > 0 {
			// The broker answered, and said which rows it will never take.
			return action{deadLetterNamed: true, resendRest: true, broker: breaker.BrokerUp}
		}
		if f.rows == 1 {
			// A refusal for what the message is, and it was alone: it is
			// this row's, whatever the error says.
			return action{deadLetterNamed: true, broker: breaker.BrokerUp}
		}
	}
	// Transient, or a message-class error that names none of several rows:
	// someone's fault, but whose?
	switch f.broker {
	case brokerUnknown:
		return action{check: true}
	case brokerDown:
		return action{release: true, stopTopic: true, backoff: true, broker: breaker.BrokerDown}
	}
	if f.rows > 1 {
		// The broker is up and the batch failed: find the rows that fail
		// alone. The halves' own outcomes say what the topic does next.
		return action{split: true, broker: breaker.BrokerUp}
	}
	a := action{attempt: true, broker: breaker.BrokerUp, stopTopic: f.ordered, backoff: f.ordered}
	if f.maxAttempts > 0 && f.attempts+1 >= f.maxAttempts {
		a.exhausted = true
	}
	return a
}

// decideCut is the policy for a producer's refusal to cut a topic's rows into
// batches, before anything is sent.
func decideCut(f failure) action {
	switch {
	case f.named > 0:
		// Rows the producer can tell are invalid for the broker (over a
		// protocol limit, say): they never touch the connection.
		return action{deadLetterNamed: true, resendRest: true}
	case f.class == producer.ClassLocal:
		return action{release: true, stopTopic: true}
	case f.class == producer.ClassTopic:
		// No message of the topic could ever be valid (an invalid subject).
		return action{release: true, note: true, stopTopic: true, tripTopic: true}
	case f.class == producer.ClassMessage && f.rows == 1:
		// A refusal for what the messages are, of one row: it is this row's.
		return action{deadLetterNamed: true}
	case f.class == producer.ClassMessage:
		// The producer refuses the rows without saying which: cut the halves
		// on their own until the refused rows stand alone.
		return action{split: true}
	default:
		// The producer needs its broker to cut and cannot reach it: without
		// this verdict the broker breaker would never see the outage.
		return action{release: true, stopTopic: true, backoff: true, broker: breaker.BrokerDown}
	}
}

// stormed turns an action that would dead-letter rows past the storm guard's
// limit into one that dead-letters nothing and trips the topic: so many rows
// of one topic refused in so short a time is something wrong beyond single
// messages (a broker error misread as theirs), and emptying the outbox into
// the dead-letter table would hide it.
func (a action) stormed() action {
	a.deadLetterNamed, a.exhausted, a.resendRest = false, false, false
	a.release = !a.attempt
	a.stopTopic, a.tripTopic = true, true
	return a
}

// blameTopicAfterSplit reports whether a split batch of rows rows, of which
// failedAlone failed one by one and none was delivered, is the topic's fault:
// every message failing whatever it is says the destination is wrong, even
// though the producer could not say so. One bad row among good ones never
// blames the topic, nor do two or three side by side (minTopicBlame). Under
// OrderingTopic a split stops at the first row that fails alone, so it never
// blames the topic: the row's attempts do the work.
func blameTopicAfterSplit(rows, delivered, failedAlone int) bool {
	return rows >= minTopicBlame && delivered == 0 && failedAlone == rows
}

// minTopicBlame is the fewest rows, all failing alone, that blame their topic.
const minTopicBlame = 4

// deadLetters reports whether the action moves rows to the dead-letter table.
func (a action) deadLetters() bool { return a.deadLetterNamed || a.exhausted }

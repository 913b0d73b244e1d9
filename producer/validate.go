package producer

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Validation: every producer checks each row against its broker's protocol
// limits in Batches, before any send, so that a row that can never be valid
// (an AMQP short string over 255 bytes, a header frame over frame_max, a NATS
// header key with a space) is dead-lettered at once with a reason that names
// the limit, and never reaches the connection the other topics share. Some
// such rows do not just fail: they close the connection (RabbitMQ's
// FRAME_ERROR, NATS's maximum control line), which would blame the broker for
// a row and break the sends of every topic in flight. These helpers keep that
// bookkeeping the same in every producer.

// Rejections collects the rows a producer leaves out of its batches, each with
// its own reason, for one message-class error (see [NewRejections]). The zero
// value is ready to use.
type Rejections struct {
	reasons map[int64]string
	texts   []error // the first maxRejectionTexts rows' errors
	more    int     // rows rejected past those
}

// maxRejectionTexts bounds the rows whose error text the joint error carries,
// so that a page of 500 bad rows does not make a log line of 50 kB; every row
// is still named, with its reason.
const maxRejectionTexts = 10

// Add rejects row id for reason (a Reason constant) with err, which should
// name the row, the field, its size and the limit. A row rejected already
// keeps its first reason.
func (r *Rejections) Add(id int64, reason string, err error) {
	if r.reasons == nil {
		r.reasons = make(map[int64]string)
	}
	if _, ok := r.reasons[id]; ok {
		return
	}
	r.reasons[id] = reason
	if len(r.texts) < maxRejectionTexts {
		r.texts = append(r.texts, err)
	} else {
		r.more++
	}
}

// Len returns how many rows are rejected.
func (r *Rejections) Len() int { return len(r.reasons) }

// Rejected reports whether row id is rejected.
func (r *Rejections) Rejected(id int64) bool {
	_, ok := r.reasons[id]
	return ok
}

// Err returns the message-class error naming every rejected row with its
// reason, or nil when none is.
func (r *Rejections) Err() error {
	if len(r.reasons) == 0 {
		return nil
	}
	return NewRejections(r.reasons, rejectionsError{errs: r.texts, more: r.more})
}

// Keep returns the messages of msgs that check accepts, in order, and rejects
// the others with the reason and error check returns. A check returns "" and
// nil for a row that is fine.
//
// When check accepts every row, the common case, Keep returns msgs itself: the
// hot path copies nothing.
func (r *Rejections) Keep(msgs []Message, check func(*Message) (reason string, err error)) []Message {
	var out []Message // nil until the first rejection
	for i := range msgs {
		reason, err := check(&msgs[i])
		if err != nil {
			if out == nil {
				out = make([]Message, i, len(msgs)-1)
				copy(out, msgs[:i])
			}
			r.Add(msgs[i].ID, reason, err)
			continue
		}
		if out != nil {
			out = append(out, msgs[i])
		}
	}
	if out == nil {
		return msgs
	}
	return out
}

// rejectionsError joins the rows' errors on one line, for logs and the dead
// letters' last error.
type rejectionsError struct {
	errs []error
	more int
}

func (e rejectionsError) Error() string {
	var b strings.Builder
	for i, err := range e.errs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	if e.more > 0 {
		fmt.Fprintf(&b, "; and %d more rows", e.more)
	}
	return b.String()
}

func (e rejectionsError) Unwrap() []error { return e.errs }

// Quote quotes s for an error message, cut to its first 64 bytes: a topic of
// 10,000 bytes names itself well enough by its start, and an error must not
// carry a payload-sized value into logs and dead letters. The caller says the
// size where it matters.
func Quote(s string) string {
	const keep = 64
	if len(s) <= keep {
		return fmt.Sprintf("%q", s)
	}
	cut := keep
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q…", s[:cut])
}

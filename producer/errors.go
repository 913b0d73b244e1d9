package producer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
)

// Class says what a failed send means for the sweeper. Producers report it by
// returning an [*Error]; the sweeper acts on the class, never on a broker's own
// error types.
type Class int

const (
	// ClassTransient is a failure that may go away by itself: a timeout, a reset
	// connection, a busy or throttling broker. It is the zero value, so an error a
	// producer did not classify counts as transient.
	ClassTransient Class = iota
	// ClassTopic is a failure of the destination, whatever the message: the entity
	// does not exist, we are not authorized for it, nothing is bound to the routing
	// key. Retrying soon will not help.
	ClassTopic
	// ClassMessage is a failure of particular messages: too large, or invalid for
	// the broker. The error names the rows; the other messages can go on.
	ClassMessage
	// ClassLocal is a failure on our side that says nothing about the broker or the
	// messages: the send was cancelled because the sweeper is shutting down, or the
	// producer is closed. It raises no attempts count.
	ClassLocal
	// ClassBroker is a failure to reach the broker at all: the connection was
	// refused, reset or closed, or a dial timed out. It is retried in the call
	// like a transient failure, but it is never the rows' fault: it counts no
	// attempt and feeds the broker breaker, however long it lasts. [ClassOf]
	// gives it to unclassified network errors of those kinds.
	ClassBroker
)

// String returns the class's name as used in logs and metric labels.
func (c Class) String() string {
	switch c {
	case ClassTransient:
		return "transient"
	case ClassTopic:
		return "topic"
	case ClassMessage:
		return "message"
	case ClassLocal:
		return "local"
	case ClassBroker:
		return "broker"
	default:
		return fmt.Sprintf("class(%d)", int(c))
	}
}

// Reasons that message-class errors carry. They become the dead-letter reason.
const (
	ReasonInvalidMessage  = "invalid_message"
	ReasonMessageTooLarge = "message_too_large"
)

// Error is a classified producer failure.
type Error struct {
	// Class says what the sweeper does with the failure.
	Class Class
	// Reason is a short snake_case word for logs and dead letters, such as
	// "message_too_large" or "topic_not_found". It may be empty.
	Reason string
	// IDs names the rows a message-class error concerns. Empty for other classes.
	IDs []int64
	// Reasons gives rows of IDs a reason of their own, when one call rejects
	// rows for different reasons; a row not in it takes Reason. See [RowReason].
	Reasons map[int64]string
	// Delivered names the rows of the send the broker took before it failed
	// (acknowledged, confirmed, or written to their partition), of any
	// class. The sweeper moves them as sent, like a success, and never sends
	// them again; the other rows are judged by the class. Empty: the
	// sweeper assumes none arrived, and a resend may duplicate some. See
	// [WithDelivered].
	Delivered []int64
	// Err is the underlying error.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Class.String())
	b.WriteString(" failure")
	if e.Reason != "" {
		b.WriteString(" (")
		b.WriteString(e.Reason)
		b.WriteString(")")
	}
	if len(e.IDs) > 0 {
		fmt.Fprintf(&b, " of rows %v", e.IDs)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// NewTransientError marks err as transient. Unclassified errors are transient
// already; this is for a producer that wants to say so, or give a reason.
func NewTransientError(reason string, err error) error {
	return &Error{Class: ClassTransient, Reason: reason, Err: err}
}

// NewTopicError marks err as a failure of the destination.
func NewTopicError(reason string, err error) error {
	return &Error{Class: ClassTopic, Reason: reason, Err: err}
}

// NewMessageError marks err as a failure of the rows ids, for reason (one of the
// Reason constants, or a word of the producer's own).
func NewMessageError(reason string, ids []int64, err error) error {
	return &Error{Class: ClassMessage, Reason: reason, IDs: ids, Err: err}
}

// NewBrokerError marks err as a failure to reach the broker (see [ClassBroker]).
func NewBrokerError(reason string, err error) error {
	return &Error{Class: ClassBroker, Reason: reason, Err: err}
}

// NewRejections returns a message-class error naming the rows of reasons, each
// with its own reason, or nil when reasons is empty. err describes the first
// rejection; the sweeper dead-letters each row with its reason.
func NewRejections(reasons map[int64]string, err error) error {
	if len(reasons) == 0 {
		return nil
	}
	ids := make([]int64, 0, len(reasons))
	for id := range reasons {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return &Error{Class: ClassMessage, Reason: reasons[ids[0]], IDs: ids, Reasons: reasons, Err: err}
}

// NewLocalError marks err as a failure on our side, such as a closed producer.
func NewLocalError(err error) error {
	return &Error{Class: ClassLocal, Err: err}
}

// ClassOf returns err's class: the class of the first [*Error] in its chain;
// [ClassLocal] for a cancelled context, since that is the sweeper stopping, not
// the broker failing; [ClassBroker] for a connection refused, reset or closed
// and a failed dial; otherwise [ClassTransient]. A nil error has no class and
// ClassOf panics on it, since asking is a programming error.
func ClassOf(err error) Class {
	if err == nil {
		panic("producer.ClassOf(nil)")
	}
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Class
	}
	if errors.Is(err, context.Canceled) {
		return ClassLocal
	}
	if connectionFailed(err) {
		return ClassBroker
	}
	return ClassTransient
}

// connectionFailed reports errors that say the connection itself failed, not
// the request on it: whatever the rows held, the broker was not reached.
func connectionFailed(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return true
	}
	if op, ok := errors.AsType[*net.OpError](err); ok && op.Op == "dial" {
		return true
	}
	return false
}

// ReasonOf returns the reason of the first [*Error] in err's chain, or "".
func ReasonOf(err error) string {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Reason
	}
	return ""
}

// RowReason returns the dead-letter reason a message-class error gives row id:
// its own reason if the error has one, else the error's reason, else
// [ReasonInvalidMessage].
func RowReason(err error, id int64) string {
	e, ok := errors.AsType[*Error](err)
	if !ok {
		return ReasonInvalidMessage
	}
	if r := e.Reasons[id]; r != "" {
		return r
	}
	if e.Reason != "" {
		return e.Reason
	}
	return ReasonInvalidMessage
}

// MessageIDs returns the rows a message-class error names, or nil when err is not
// of the message class.
func MessageIDs(err error) []int64 {
	if e, ok := errors.AsType[*Error](err); ok && e.Class == ClassMessage {
		return e.IDs
	}
	return nil
}

// Delivered returns the rows err says the broker took before the failure,
// or nil.
func Delivered(err error) []int64 {
	// Not only the first *Error of the chain: PinOn and the like wrap a
	// producer's error in one of their own.
	for ; err != nil; err = errors.Unwrap(err) {
		if e, ok := err.(*Error); ok && len(e.Delivered) > 0 {
			return e.Delivered
		}
	}
	return nil
}

// WithDelivered returns err saying that the broker took the rows ids before
// it failed: the sweeper then sends them no more. err keeps its class and
// reason; the rows add to those err already names as delivered. With no
// ids, or a nil err, err is returned as it is.
func WithDelivered(err error, ids []int64) error {
	if err == nil || len(ids) == 0 {
		return err
	}
	if e, ok := err.(*Error); ok {
		c := *e
		c.Delivered = append(slices.Clip(e.Delivered), ids...)
		return &c
	}
	if e, ok := errors.AsType[*Error](err); ok {
		// A classified error wrapped in context: keep the context's text.
		return &Error{Class: e.Class, Reason: e.Reason, IDs: e.IDs, Reasons: e.Reasons,
			Delivered: append(slices.Clip(e.Delivered), ids...), Err: err}
	}
	return &Error{Class: ClassOf(err), Delivered: slices.Clone(ids), Err: err}
}

// PinOn names row id in a message-class error that names no row, so the sweeper
// charges that row and sends its neighbours; other errors are returned as they
// are. A producer uses it when the broker rejects a whole send for one message
// it can tell.
func PinOn(err error, id int64) error {
	if err != nil && ClassOf(err) == ClassMessage && len(MessageIDs(err)) == 0 {
		return NewMessageError(ReasonOf(err), []int64{id}, err)
	}
	return err
}

// PinOnLargest pins a message-class error the broker raised for a whole batch
// (content too large) on the batch's largest payload, the one that must have
// caused it.
func PinOnLargest(err error, b Batch) error {
	if err == nil || len(b.Messages) == 0 {
		return err
	}
	largest := b.Messages[0]
	for _, m := range b.Messages[1:] {
		if len(m.Payload) > len(largest.Payload) {
			largest = m
		}
	}
	return PinOn(err, largest.ID)
}

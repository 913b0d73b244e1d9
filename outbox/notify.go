package outbox

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
)

// NotifyChannel is the channel the outbox's trigger (migration 4) notifies on
// commit, with the schema-qualified table name as payload.
const NotifyChannel = "outbox_sweeper"

// listenCheckInterval is how long the listener waits for a notification before
// it pings its connection: a connection to a host that vanished without closing
// it would otherwise wait for good, and polling alone would carry the sweeper.
const listenCheckInterval = 30 * time.Second

// listener holds a dedicated connection that LISTENs for the outbox's trigger
// and signals wake, which holds at most one signal: notifications that arrive
// while a sweep runs fold into one more sweep, which is the debounce.
//
// Why a connection of its own rather than one from the pool: LISTEN belongs to
// a session, and a pooled session is handed to other work between uses.
type listener struct {
	connConfig *pgx.ConnConfig
	payload    string // the table, as the trigger names it
	logger     *slog.Logger
	wake       chan struct{}
	// listening, if set, is told when the connection comes up and goes down.
	listening func(up bool)
	// notified is called with each notification's payload; connected, at
	// each (re)connection. They default to signalling wake for the table's
	// notifications, and at each connection.
	notified  func(payload string)
	connected func()
	// backoff paces reconnections; tests shorten it.
	initialBackoff, maxBackoff time.Duration
}

func newListener(connConfig *pgx.ConnConfig, t Table, logger *slog.Logger, listening func(up bool)) *listener {
	if listening == nil {
		listening = func(bool) {}
	}
	l := &listener{
		connConfig:     connConfig,
		payload:        t.String(),
		logger:         logger,
		listening:      listening,
		wake:           make(chan struct{}, 1),
		initialBackoff: 250 * time.Millisecond,
		maxBackoff:     10 * time.Second,
	}
	l.notified = func(payload string) {
		if payload == l.payload {
			l.signal()
		}
	}
	l.connected = l.signal
	return l
}

// Listen LISTENs on NotifyChannel with a connection of its own, opened with
// connConfig, until ctx is done, reconnecting with backoff whenever the
// connection is lost (and logging that to logger). It calls notified with
// each notification's payload, the schema-qualified name of the outbox a
// commit wrote to, and connected at each (re)connection: what was committed
// while no one listened notified no one. One session serves every outbox of
// the database, which is how a host of many outboxes (package fleet) wakes
// them. Both are called from Listen's goroutine, one at a time.
func Listen(ctx context.Context, connConfig *pgx.ConnConfig, logger *slog.Logger, notified func(payload string), connected func()) {
	l := newListener(connConfig, Table{}, logger, nil)
	l.notified, l.connected = notified, connected
	l.run(ctx)
}

func (l *listener) signal() {
	select {
	case l.wake <- struct{}{}:
	default: // a sweep is already due
	}
}

// run listens until ctx is done, reconnecting with backoff whenever the
// connection is lost. Each (re)connection signals once: rows committed while
// no one listened would otherwise wait for the next tick.
func (l *listener) run(ctx context.Context) {
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval, retry.MaxInterval = l.initialBackoff, l.maxBackoff
	lost, connected := false, false
	for ctx.Err() == nil {
		err := l.listen(ctx, func() {
			if lost {
				l.logger.Info("listening for commits again; wake-ups resume")
				lost = false
			}
			connected = true
			l.listening(true)
			retry.Reset()
			l.connected()
		})
		l.listening(false)
		if ctx.Err() != nil {
			return
		}
		delay := retry.NextBackOff()
		if !lost {
			msg := "lost the connection that listens for commits; sweeps follow the schedule until it is back"
			if !connected {
				msg = "cannot open the connection that listens for commits; sweeps follow the schedule until it opens"
			}
			l.logger.Warn(msg, "err", err, "retry_in", delay.Round(time.Millisecond))
			lost = true
		} else {
			l.logger.Debug("listen connection still down", "err", err, "retry_in", delay.Round(time.Millisecond))
		}
		if !sleepUntil(ctx, time.Now().Add(delay)) {
			return
		}
	}
}

// listen connects, LISTENs, calls connected, and signals for every notification
// of this table until the connection fails or ctx is done.
func (l *listener) listen(ctx context.Context, connected func()) error {
	connectCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(connectCtx, l.connConfig)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(connectCtx, "LISTEN "+NotifyChannel); err != nil {
		return err
	}
	connected()
	for {
		waitCtx, cancel := context.WithTimeout(ctx, listenCheckInterval)
		n, err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			l.notified(n.Payload)
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded) && !conn.IsClosed():
			// Quiet for a while: make sure the connection still answers.
			pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := conn.Ping(pingCtx)
			cancel()
			if err != nil {
				return err
			}
		default:
			return err
		}
	}
}

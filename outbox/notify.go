package outbox

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
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

	// The session also runs other work (Listener.AwakeLock's statements),
	// between waits for notifications: do queues it and interrupts the
	// wait. up says the session is connected, gen counts its connections
	// (an advisory lock taken in one is gone with it).
	mu        sync.Mutex
	up        bool
	gen       uint64
	queued    []sessionCall
	interrupt context.CancelFunc // the wait under way; nil between waits
}

// sessionCall is work queued on the listener's session.
type sessionCall struct {
	ctx    context.Context
	always bool // run even if ctx ended while it waited
	fn     func(ctx context.Context, conn *pgx.Conn, gen uint64) error
	done   chan error
}

// sessionCallTimeout bounds each call on the session, from when it runs: a
// call that timed out while it waited for the session would otherwise have
// no time left, and one cut short mid-statement ends the session (pgx closes
// a connection whose statement it abandoned) and every outbox's lock with it.
const sessionCallTimeout = 5 * time.Second

// errNoSession is do's error while the session is down.
var errNoSession = errors.New("the LISTEN session is not connected")

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
	NewListener(connConfig, logger, notified, connected).Run(ctx)
}

// Listener is Listen's session, which also holds the awake locks of the
// database's outboxes (AwakeLock): a host of many outboxes (package fleet)
// keeps one session for its database, whatever its number of outboxes, and a
// busy one's commits stop notifying as a sweeper of its own makes them.
type Listener struct{ l *listener }

// NewListener returns a Listener that calls notified and connected as
// Listen does, once Run runs.
func NewListener(connConfig *pgx.ConnConfig, logger *slog.Logger, notified func(payload string), connected func()) *Listener {
	l := newListener(connConfig, Table{}, logger, nil)
	l.notified, l.connected = notified, connected
	return &Listener{l: l}
}

// Run listens until ctx is done, as Listen does.
func (l *Listener) Run(ctx context.Context) { l.l.run(ctx) }

// OnListening has Run call f with true each time its session listens, and
// with false each time it is lost (ListenObserver). Call it before Run.
func (l *Listener) OnListening(f func(up bool)) {
	if f != nil {
		l.l.listening = f
	}
}

// do runs fn on the session between two waits for notifications, and
// returns its error; errNoSession at once while the session is down. gen
// tells fn which connection of the session it runs on. A call whose ctx
// ends while it waits is not run, unless always: a release must run.
//
// do must not be called from the listener's own callbacks (notified,
// connected): it waits for the goroutine that runs them.
func (l *listener) do(ctx context.Context, always bool, fn func(ctx context.Context, conn *pgx.Conn, gen uint64) error) error {
	c := sessionCall{ctx: ctx, always: always, fn: fn, done: make(chan error, 1)}
	l.mu.Lock()
	if !l.up {
		l.mu.Unlock()
		return errNoSession
	}
	l.queued = append(l.queued, c)
	if l.interrupt != nil {
		l.interrupt()
	}
	l.mu.Unlock()
	// No return before the call's answer: a call that ran after its caller
	// gave up could take a lock no one knows of, which would silence the
	// outbox's notifications for as long as the session lives. The answer
	// is never long in coming: the wait is interrupted, a call whose ctx is
	// done is answered without running, and a session that ends answers
	// every call queued.
	return <-c.done
}

// serve runs the calls queued, and reports whether the session is still
// fit to wait on. A call's error that is the connection's ends the session.
func (l *listener) serve(conn *pgx.Conn) bool {
	l.mu.Lock()
	calls, gen := l.queued, l.gen
	l.queued = nil
	l.mu.Unlock()
	for _, c := range calls {
		if c.ctx.Err() != nil && !c.always {
			c.done <- c.ctx.Err()
			continue
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), sessionCallTimeout)
		c.done <- c.fn(ctx, conn, gen)
		cancel()
	}
	// Notifications that came during the calls wait in pgx's buffer; a
	// wait with a context already done hands them out without reading.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for {
		n, err := conn.WaitForNotification(done)
		if err != nil {
			break
		}
		l.notified(n.Payload)
	}
	return !conn.IsClosed()
}

// session marks the session up (a new connection of it) or down; down fails
// the calls queued.
func (l *listener) session(up bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.up = up
	if up {
		l.gen++
		return
	}
	for _, c := range l.queued {
		c.done <- errNoSession
	}
	l.queued = nil
}

// waiting publishes cancel as the way to interrupt the wait about to start,
// and reports whether it may start: false if calls came meanwhile. nil ends
// the wait.
func (l *listener) waiting(cancel context.CancelFunc) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.interrupt = cancel
	return cancel == nil || len(l.queued) == 0
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
	// Before LISTEN, which stays the session's last statement in
	// pg_stat_activity while it only listens: what an operator looks for.
	keepAlive(connectCtx, conn, l.logger)
	if _, err := conn.Exec(connectCtx, "LISTEN "+NotifyChannel); err != nil {
		return err
	}
	l.session(true)
	defer l.session(false)
	connected()
	for {
		if !l.serve(conn) {
			return errors.New("the LISTEN session's connection closed")
		}
		waitCtx, cancel := context.WithTimeout(ctx, listenCheckInterval)
		var interrupted atomic.Bool
		if !l.waiting(func() { interrupted.Store(true); cancel() }) {
			cancel()
			continue // calls to serve first
		}
		n, err := conn.WaitForNotification(waitCtx)
		l.waiting(nil)
		cancel()
		switch {
		case err == nil:
			l.notified(n.Payload)
		case ctx.Err() != nil:
			return ctx.Err()
		case interrupted.Load() && !conn.IsClosed():
			// Calls came: served at the top.
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

// keepAliveSettings make the server probe a session's client when the
// connection has been idle 10 s, and end the session after three probes 5 s
// apart go unanswered. The sessions that LISTEN or hold an awake lock are
// idle for long, and after a network partition the client has long given up
// on them and connected again; without probes the server keeps the old
// session, and the awake lock it holds (commits to that outbox then notify
// no one), until the system's keepalive gives up: two hours by default.
const keepAliveSettings = "SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3"

// keepAlive applies keepAliveSettings to conn's session. They are session
// settings, rather than connection parameters, so that a pooler in session
// mode that refuses unknown startup parameters lets them through; one that
// refuses them costs only the probes (a Unix socket ignores them anyway).
func keepAlive(ctx context.Context, conn *pgx.Conn, logger *slog.Logger) {
	if _, err := conn.Exec(ctx, keepAliveSettings); err != nil {
		logger.Debug("could not set TCP keepalives on a long-idle session; the server may keep it long after a network partition", "err", err)
	}
}

package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// unreachable reports whether err says the database could not be reached,
// rather than that a statement failed: no connection could be made, the
// server is shutting down or starting up, or the connection broke under the
// statement. These pass by themselves, or with the operator's fix of the
// database; a statement's own failure is a bug to report.
func unreachable(err error) bool {
	// First: a connection that could not be made is an outage however it
	// failed, a connect timeout included (a hung server, a failover in
	// progress), though pgx wraps that in context.DeadlineExceeded.
	var connect *pgconn.ConnectError
	if errors.As(err, &connect) {
		return true
	}
	// A deadline or a cancellation is the caller's, or a statement too slow
	// for it: a database that answers slowly is no outage to wait out.
	// (context.DeadlineExceeded is a net.Error too.)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		// Class 08 is connection exceptions; 57P01 to 57P03 are
		// admin_shutdown, crash_shutdown and cannot_connect_now.
		return strings.HasPrefix(pg.Code, "08") || pg.Code == "57P01" || pg.Code == "57P02" || pg.Code == "57P03"
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return !netErr.Timeout()
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}

// unsent reports whether err came before anything reached the database (no
// connection, or pgx knows the statement was not sent): a change asked for
// was not made, and the call can be made again as it was.
func unsent(err error) bool {
	var connect *pgconn.ConnectError
	return errors.As(err, &connect) || pgconn.SafeToRetry(err)
}

// databaseError is an error of a statement on one database, of the several a
// fleet's call may read (onDatabase).
type databaseError struct {
	database string
	err      error
}

func (e *databaseError) Error() string { return e.err.Error() }
func (e *databaseError) Unwrap() error { return e.err }

// onDatabase marks err as met on the database named name, so that a 503
// names that one; nil stays nil.
func onDatabase(name string, err error) error {
	if err == nil {
		return nil
	}
	return &databaseError{database: name, err: err}
}

// onNamedDatabase is onDatabase with the database's name in the error's
// text, for errors that reach a log with no other word of which database
// it was: a relay of several reads them at once, and an error met on one (a
// permission refused, say) does not name it itself.
func onNamedDatabase(name string, err error) error {
	if err == nil {
		return nil
	}
	return &databaseError{database: name, err: fmt.Errorf("database %s: %w", quoteShort(name), err)}
}

// databaseName returns the name of cfg's database: Database, else the name
// in its pool's connection string.
func (cfg Config) databaseName() string {
	if cfg.Database != "" || cfg.Pool == nil {
		return cfg.Database
	}
	return cfg.Pool.Config().ConnConfig.Database
}

// databaseName names the database err failed to reach: the one onDatabase
// named, else cfg's own name for it (a listed name), else the one its
// connection attempt named, else its pool's. Only the name: the error's
// host and user stay in the log.
func databaseName(err error, cfg Config) string {
	var on *databaseError
	if errors.As(err, &on) {
		return on.database
	}
	var connect *pgconn.ConnectError
	if cfg.Database == "" && errors.As(err, &connect) && connect.Config != nil && connect.Config.Database != "" {
		return connect.Config.Database
	}
	return cfg.databaseName()
}

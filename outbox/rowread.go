package outbox

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-sweeper/sweeper/producer"
)

// ReasonUnreadableRow is the dead-letter reason of a row the sweeper read but
// cannot make a message of: a column holds a value Postgres accepts and the
// sweeper cannot use (an infinite created_at, headers nested deeper than Go's
// JSON decoder reads). Its error names the column and the value, cut short.
//
// Why the row and not the page: the page's rows are read in one statement, and
// a value that failed the scan used to fail the statement, and with it every
// sweep, every topic, for as long as the row stayed. Each column is now read
// as it comes (timestamps with their infinities, headers as bytes) and judged
// here, one row at a time.
const ReasonUnreadableRow = "unreadable_row"

// maxUnreadableValue bounds the value an unreadable row's error quotes: the
// column may hold megabytes, and the error goes to the dead-letter table and
// the log.
const maxUnreadableValue = 64

// readRow fills m's headers and timestamps from the raw values of an outbox
// row's columns and judges them. It returns "" when the row can be sent (or
// expired: a past expires_at is the expiry's to judge), else why not, naming
// the column and its value cut short; m is then filled as far as it could be.
//
//   - headers must be JSON that Go's decoder reads (Postgres's jsonb always
//     prints valid JSON, but may nest it deeper than the 10,000 levels Go
//     reads); what it holds is the producer's to judge, as before.
//   - created_at must be finite: 'infinity' or '-infinity' has no age and no
//     time to give the broker (migration 8 refuses new ones).
//   - expires_at 'infinity' is no deadline (as NULL is); '-infinity' passed
//     long ago.
func readRow(m *producer.Message, headers []byte, createdAt, expiresAt pgtype.Timestamptz) (why string) {
	m.Headers = headers
	switch {
	case !createdAt.Valid:
		why = "created_at is NULL"
	case createdAt.InfinityModifier != pgtype.Finite:
		why = "created_at is '" + createdAt.InfinityModifier.String() + "': a row must say when it was written with a finite time"
	default:
		m.CreatedAt = createdAt.Time
	}
	if expiresAt.Valid {
		switch expiresAt.InfinityModifier {
		case pgtype.Infinity: // no deadline
		case pgtype.NegativeInfinity:
			m.ExpiresAt = longAgo
		default:
			m.ExpiresAt = expiresAt.Time
		}
	}
	if why != "" {
		return why
	}
	// "{}" is the usual value: no scan for it.
	if len(headers) != 2 || headers[0] != '{' || headers[1] != '}' {
		if !json.Valid(headers) {
			var v any
			err := json.Unmarshal(headers, &v) // the decoder says why
			return fmt.Sprintf("headers cannot be read as JSON (%v): %s", err, quoteValue(headers))
		}
	}
	return ""
}

// longAgo stands for an expires_at of '-infinity': Postgres's earliest
// timestamp, long past whatever the clock says.
var longAgo = time.Date(-4713, time.November, 24, 0, 0, 0, 0, time.UTC)

// quoteValue quotes b cut to maxUnreadableValue bytes, with its full size
// when cut.
func quoteValue(b []byte) string {
	if len(b) <= maxUnreadableValue {
		return strconv.Quote(string(b))
	}
	return fmt.Sprintf("%s (%d bytes)", strconv.Quote(truncate(string(b), maxUnreadableValue)), len(b))
}

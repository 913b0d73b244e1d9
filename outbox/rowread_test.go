package outbox

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
)

func finite(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: true} }

func infinite(m pgtype.InfinityModifier) pgtype.Timestamptz {
	return pgtype.Timestamptz{InfinityModifier: m, Valid: true}
}

// nested returns a headers object holding one array nested depth deep.
func nested(depth int) []byte {
	return []byte(`{"a":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`)
}

// Each value Postgres accepts in a column the sweeper reads is either used as
// it is, or named, with the column and the value cut short, as the reason the
// row cannot be sent.
func TestReadRowJudgesEachColumn(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name                 string
		headers              []byte
		createdAt, expiresAt pgtype.Timestamptz
		why                  []string // substrings of the reason; none: the row is readable
		check                func(t *testing.T, m producer.Message)
	}{
		{name: "a plain row", headers: []byte(`{}`), createdAt: finite(now),
			check: func(t *testing.T, m producer.Message) {
				require.Equal(t, now, m.CreatedAt)
				require.True(t, m.ExpiresAt.IsZero(), "NULL expires_at: no deadline")
				require.JSONEq(t, `{}`, string(m.Headers))
			}},
		{name: "expires_at infinity is no deadline", headers: []byte(`{}`), createdAt: finite(now), expiresAt: infinite(pgtype.Infinity),
			check: func(t *testing.T, m producer.Message) { require.True(t, m.ExpiresAt.IsZero()) }},
		{name: "expires_at -infinity passed long ago", headers: []byte(`{}`), createdAt: finite(now), expiresAt: infinite(pgtype.NegativeInfinity),
			check: func(t *testing.T, m producer.Message) {
				require.False(t, m.ExpiresAt.IsZero())
				require.True(t, m.ExpiresAt.Before(time.Unix(0, 0)))
			}},
		{name: "a far expires_at is kept", headers: []byte(`{}`), createdAt: finite(now),
			expiresAt: finite(time.Date(294276, 12, 31, 23, 59, 59, 0, time.UTC)),
			check:     func(t *testing.T, m producer.Message) { require.Equal(t, 294276, m.ExpiresAt.Year()) }},
		{name: "an early created_at is kept", headers: []byte(`{}`), createdAt: finite(time.Date(-4713, 11, 24, 0, 0, 0, 0, time.UTC)),
			check: func(t *testing.T, m producer.Message) { require.Equal(t, -4713, m.CreatedAt.Year()) }},
		{name: "created_at infinity", headers: []byte(`{}`), createdAt: infinite(pgtype.Infinity),
			why: []string{"created_at", "'infinity'"}},
		{name: "created_at -infinity", headers: []byte(`{}`), createdAt: infinite(pgtype.NegativeInfinity),
			why: []string{"created_at", "'-infinity'"}},
		{name: "headers 10,000 deep are read", headers: nested(9_999), createdAt: finite(now)},
		{name: "headers 11,000 deep", headers: nested(11_000), createdAt: finite(now),
			why: []string{"headers", "depth", `"{\"a\":[[[[`, "(22006 bytes)"}},
		{name: "headers that are no object are the producer's to judge", headers: []byte(`[1,"x"]`), createdAt: finite(now)},
		{name: "huge numbers and odd text in headers", headers: []byte(`{"n":1` + strings.Repeat("0", 5000) + `,"s":"\u2028\ud83d\ude00 \\ \""}`), createdAt: finite(now)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := producer.Message{ID: 1}
			why := readRow(&m, tt.headers, tt.createdAt, tt.expiresAt)
			if len(tt.why) == 0 {
				require.Empty(t, why)
			}
			for _, w := range tt.why {
				require.Contains(t, why, w)
			}
			require.Less(t, len(why), 400, "the reason quotes the value cut short")
			if tt.check != nil {
				tt.check(t, m)
			}
		})
	}
}

// FuzzReadRow reads rows with values Postgres accepts: headers as jsonb
// prints them (valid JSON, nested to any depth, with any text), timestamps
// anywhere in timestamptz's range or infinite. It never panics; a row it calls
// readable decodes as the producers decode it; a row it refuses is refused
// for a column it names, in a bounded reason.
func FuzzReadRow(f *testing.F) {
	f.Add("x", uint16(0), int64(0), int8(0), int64(0), int8(0))
	f.Add("", uint16(1), int64(1_700_000_000), int8(1), int64(0), int8(1))
	f.Add("\u00e9\u2028", uint16(9_999), int64(-210_866_803_200), int8(0), int64(9_224_318_015_999), int8(-1))
	f.Add("deep", uint16(11_000), int64(0), int8(-1), int64(0), int8(0))
	f.Add(strings.Repeat("long ", 200), uint16(3), int64(1), int8(0), int64(-1), int8(0))
	f.Fuzz(func(t *testing.T, text string, depth uint16, created int64, createdInf int8, expires int64, expiresInf int8) {
		value, err := json.Marshal(text) // as jsonb prints a string: valid JSON
		require.NoError(t, err)
		headers := []byte(`{"k":` + strings.Repeat("[", int(depth)) + string(value) + strings.Repeat("]", int(depth)) + `}`)
		createdAt, expiresAt := timestamptz(created, createdInf), timestamptz(expires, expiresInf)
		m := producer.Message{ID: 1}
		why := readRow(&m, headers, createdAt, expiresAt)

		if expiresAt.InfinityModifier == pgtype.Infinity {
			require.True(t, m.ExpiresAt.IsZero(), "infinity is no deadline")
		} else {
			require.False(t, m.ExpiresAt.IsZero())
		}
		if why == "" {
			require.Equal(t, pgtype.Finite, createdAt.InfinityModifier)
			require.True(t, m.CreatedAt.Equal(createdAt.Time))
			h, err := m.DecodeHeaders()
			require.NoError(t, err, "a readable row's headers decode as the producers decode them")
			require.Contains(t, h, "k")
			return
		}
		require.Less(t, len(why), 400)
		switch {
		case createdAt.InfinityModifier != pgtype.Finite:
			require.True(t, strings.HasPrefix(why, "created_at"), why)
		default:
			require.True(t, strings.HasPrefix(why, "headers"), why)
			require.Greater(t, int(depth), 9_000, "only depth makes jsonb's output unreadable")
		}
	})
}

// timestamptz returns a timestamptz Postgres accepts: infinite by the sign of
// inf, else sec seconds since 1970, brought within 4713 BC and 294276 AD.
func timestamptz(sec int64, inf int8) pgtype.Timestamptz {
	switch {
	case inf > 0:
		return infinite(pgtype.Infinity)
	case inf < 0:
		return infinite(pgtype.NegativeInfinity)
	}
	const lo, hi = -210_866_803_200, 9_224_318_015_999
	if sec < lo || sec > hi {
		sec = lo + (sec&0x7fff_ffff_ffff_ffff)%(hi-lo)
	}
	return finite(time.Unix(sec, 0).UTC())
}

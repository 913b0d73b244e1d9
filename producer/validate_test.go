package producer_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
)

func TestRejectionsNameEveryRowWithItsOwnReason(t *testing.T) {
	t.Parallel()
	var rej producer.Rejections
	require.NoError(t, rej.Err(), "no rejection, no error")
	msgs := []producer.Message{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}}
	kept := rej.Keep(msgs, func(m *producer.Message) (string, error) {
		switch m.ID {
		case 2:
			return producer.ReasonInvalidMessage, fmt.Errorf("row 2: correlation_id of 300 bytes is over the limit")
		case 4:
			return producer.ReasonMessageTooLarge, fmt.Errorf("row 4: headers too large")
		}
		return "", nil
	})
	require.Equal(t, []int64{1, 3}, producer.Batch{Messages: kept}.IDs())
	require.Equal(t, []int64{1, 2, 3, 4}, producer.Batch{Messages: msgs}.IDs(), "the input is left as it was")
	rej.Add(2, producer.ReasonMessageTooLarge, errors.New("again")) // a row keeps its first reason

	err := rej.Err()
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err))
	require.Equal(t, []int64{2, 4}, producer.MessageIDs(err))
	require.Equal(t, producer.ReasonInvalidMessage, producer.RowReason(err, 2))
	require.Equal(t, producer.ReasonMessageTooLarge, producer.RowReason(err, 4))
	require.ErrorContains(t, err, "row 2: correlation_id of 300 bytes is over the limit; row 4: headers too large")
	require.NotContains(t, err.Error(), "again")
	require.Equal(t, 2, rej.Len())
	require.True(t, rej.Rejected(4))
	require.False(t, rej.Rejected(3))
}

// A page of bad rows names every row but keeps the text short.
func TestRejectionsTextIsBounded(t *testing.T) {
	t.Parallel()
	var rej producer.Rejections
	for id := range int64(500) {
		rej.Add(id, producer.ReasonInvalidMessage, fmt.Errorf("row %d: bad", id))
	}
	err := rej.Err()
	require.Len(t, producer.MessageIDs(err), 500)
	require.ErrorContains(t, err, "row 9: bad; and 490 more rows")
	require.NotContains(t, err.Error(), "row 10: bad")
}

func TestQuoteCutsLongValuesOnARuneBoundary(t *testing.T) {
	t.Parallel()
	require.Equal(t, `"orders"`, producer.Quote("orders"))
	long := strings.Repeat("é", 100) // 2 bytes each: byte 64 starts a rune
	q := producer.Quote("x" + long)  // shifted by one: byte 64 is inside a rune
	require.True(t, strings.HasSuffix(q, `"…`), q)
	require.Less(t, len(q), 70)
	require.NotContains(t, q, `\x`, "no rune is cut in half")
}

// Keep copies nothing when every row passes, and keeps order otherwise.
func TestKeepCopiesNothingWhenEveryRowPasses(t *testing.T) {
	t.Parallel()
	msgs := []producer.Message{{ID: 1}, {ID: 2}, {ID: 3}}
	var r producer.Rejections
	kept := r.Keep(msgs, func(*producer.Message) (string, error) { return "", nil })
	require.Same(t, &msgs[0], &kept[0], "the same backing array")
	require.NoError(t, r.Err())
	kept = r.Keep(msgs, func(m *producer.Message) (string, error) {
		if m.ID == 2 {
			return producer.ReasonInvalidMessage, errors.New("bad")
		}
		return "", nil
	})
	require.Equal(t, []int64{1, 3}, producer.Batch{Messages: kept}.IDs())
	require.EqualValues(t, 3, msgs[2].ID, "the caller's slice untouched")
	kept = (&producer.Rejections{}).Keep(msgs[:1], func(*producer.Message) (string, error) { return "x", errors.New("bad") })
	require.Empty(t, kept)
}

// FuzzEachHeader: whatever the headers column holds, EachHeader says what
// DecodeHeaders and HeaderText say (the same names, each once, with the same
// text), or refuses the row as message class; it refuses only what decoding
// refuses, or a column that is not valid JSON as a whole.
func FuzzEachHeader(f *testing.F) {
	for _, h := range []string{`{}`, ``, `{"a":"x","b":1}`, `{"a":1,"a":"y"}`, `{"n":{"m":[1,null]},"":2}`, `{"h":"a\nb<>&"}`,
		`{"k\u00e9":"\ud83d\ude00"}`, `[1]`, `null`, `{"a":1} x`, `{"a":"\xff"}`, ` { "s" : true , "t":false,"u":null } `, `{"x":-1.5e300}`,
		`{"a":[{"b":"<c>"}]}`, `{"big":12345678901234567890}`} {
		f.Add([]byte(h))
	}
	f.Fuzz(func(t *testing.T, headers []byte) {
		m := producer.Message{ID: 7, Headers: headers}
		want, decodeErr := m.DecodeHeaders()
		got := map[string]string{}
		err := m.EachHeader(func(name string, text []byte) error {
			if _, dup := got[name]; dup {
				t.Fatalf("header %q given twice", name)
			}
			got[name] = string(text)
			return nil
		})
		if err != nil {
			require.Equal(t, producer.ClassMessage, producer.ClassOf(err), "%v", err)
			require.Equal(t, []int64{7}, producer.MessageIDs(err))
			require.True(t, decodeErr != nil || !json.Valid(headers), "refused what decoding takes: %v", err)
			return
		}
		require.NoError(t, decodeErr, "took what decoding refuses")
		wantText := map[string]string{}
		for k, v := range want {
			s, err := producer.HeaderText(v)
			require.NoError(t, err)
			wantText[k] = s
		}
		require.Equal(t, wantText, got)
	})
}

package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/stdout"
)

// The harness reads the stdout producer's lines: if their format changes,
// this fails here rather than a soak measuring nothing.
func TestReaderReadsTheStdoutProducersLines(t *testing.T) {
	t.Parallel()
	w := &writer{rowsPerTx: 2, commits: []int64{time.Now().Add(-time.Second).UnixNano(), -1, 0}}
	var buf bytes.Buffer
	p := stdout.New(&buf, stdout.Config{})
	var msgs []producer.Message
	for _, row := range [][2]int{{0, 0}, {0, 1}, {0, 1}, {2, 0}} {
		payload := bytes.Repeat([]byte("x"), 512)
		copy(payload, fmt.Sprintf("soak %d %d ", row[0], row[1]))
		msgs = append(msgs, producer.Message{ID: int64(len(msgs) + 1), MessageID: "00000000-0000-4000-8000-000000000001",
			Topic: "soak.topic-0", Payload: payload, Headers: []byte(`{"payload":"c29hayAwIDAg"}`)})
	}
	msgs = append(msgs, producer.Message{ID: 9, MessageID: "m", Topic: "other", Payload: []byte("not ours")})
	require.NoError(t, p.Send(context.Background(), producer.Batch{Topic: "soak.topic-0", Messages: msgs}))

	r := &reader{w: w}
	require.NoError(t, r.run(&buf))
	lines, unique, dups, foreign := r.counts()
	require.Equal(t, []int64{5, 3, 1, 1}, []int64{lines, unique, dups, foreign})
	require.Len(t, r.lags, 3)
	require.InDelta(t, 1.0, r.lags[0], 0.5) // transaction 0 committed a second ago
	require.Zero(t, r.lags[2])              // transaction 2 is still in flight: counted 0
	// 0 arrived whole, 1 failed; 2 has not arrived whole.
	require.Equal(t, int64(2), r.low)
	require.Zero(t, r.oldest(time.Now())) // 2 is in flight: nothing committed is outstanding
}

func TestSplitArgs(t *testing.T) {
	t.Parallel()
	got, err := splitArgs(`--tick 100ms --retention-schedule '@every 10s' --x "a \"b\"" c\ d`)
	require.NoError(t, err)
	require.Equal(t, []string{"--tick", "100ms", "--retention-schedule", "@every 10s", "--x", `a "b"`, "c d"}, got)
	got, err = splitArgs("")
	require.NoError(t, err)
	require.Empty(t, got)
	_, err = splitArgs(`--x 'open`)
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "unterminated"))
}

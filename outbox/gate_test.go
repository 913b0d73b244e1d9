package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/internal/syncbuf"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// The gate is the one answer to "why is topic X not sending": a tripped
// topic says so, with its cooldown and its error; a topic nothing holds may
// send.
func TestTheGateSaysWhyATopicIsNotSending(t *testing.T) {
	t.Parallel()
	s := newSweeper(t, dbtest.Pool(t), memory.New(memory.Config{}), outbox.Config{Table: dbtest.Table(t)})
	now := time.Now()
	require.Equal(t, outbox.TopicGate{Topic: "free", Send: true}, s.Gate("free", now))
	require.Empty(t, s.Gates(now))
	require.Empty(t, s.BrokerGate(), "no broker breaker holds anything")

	s.TopicBreaker().Trip("held", "by hand")
	g := s.Gate("held", now)
	require.False(t, g.Send)
	require.Equal(t, outbox.GateTripped, g.Reason)
	require.Positive(t, g.CooldownTicks)
	require.Equal(t, []outbox.TopicGate{g}, s.Gates(now), "one answer, listed")
}

// The log line of a failure that holds its topic carries the gate's answer
// for it, as /status shows it: a topic the broker refused trips, with its
// cooldown; a topic whose row failed alone backs off, until when the gate
// says.
func TestAFailureLogsTheGatesAnswerForItsTopic(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("refused", 1)...)
	writeMessages(t, tbl, topicMessages("failing", 1)...)
	prod := memory.New(memory.Config{})
	prod.FailTopic("refused", producer.NewTopicError("topic_not_found", errors.New("404")))
	prod.FailTopic("failing", errors.New("unclassified"))
	var logs syncbuf.Buffer
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, Retry: once,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	_, err := s.Sweep(context.Background())
	require.NoError(t, err)
	now := time.Now()

	logged := map[string]map[string]any{}
	for line := range strings.Lines(logs.String()) {
		var l map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &l))
		if g, ok := l["gate"].(map[string]any); ok {
			logged[l["topic"].(string)] = g
		}
	}
	refused := s.Gate("refused", now)
	require.Equal(t, outbox.GateTripped, refused.Reason)
	require.Equal(t, map[string]any{"reason": "tripped", "cooldown_ticks": float64(refused.CooldownTicks)}, logged["refused"])
	failing := s.Gate("failing", now)
	require.Equal(t, outbox.GateBackoff, failing.Reason)
	require.Equal(t, map[string]any{"reason": "backoff", "until": failing.Until.UTC().Format(time.RFC3339Nano)}, logged["failing"])
}

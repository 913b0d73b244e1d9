package outbox_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
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

package test

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/benchutil"
	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
)

// The binary relays to NATS JetStream while the application commits 1,000
// single-row transactions a second for 20s: every row arrives. The latency
// figures are `make bench`'s (BenchmarkLatency, without the race
// detector); here they are only logged.
func TestLatencyAtAThousandCommitsASecondEveryRowArrives(t *testing.T) {
	t.Parallel()
	url := brokertest.NATSURL(t)
	prefix := brokertest.Name("latency")
	topics := benchutil.NATSStream(t, url, prefix, 10, 100_000)
	tbl := migrated(t)
	p := start(t, nil, "run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema, "--producer", "nats", "--nats-url", url)

	res := benchutil.Latency(t, tbl, benchutil.NATSSubscriber(url, prefix), topics, 1000, 20*time.Second)
	t.Logf("%d rows at %.0f commits/s: commit→received p50 %s, p99 %s, max %s (race detector on); %d duplicates",
		res.Rows, res.WriteRate, res.Quantile(0.5), res.Quantile(0.99), res.Quantile(1), res.Duplicates)
	// A row arrives a moment before its batch's commit marks it dispatched.
	dbtest.Eventually(t, time.Minute, "every row marked dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute))
}

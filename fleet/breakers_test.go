package fleet

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
)

// sharedFake is a topic breaker shared through a Redis the test controls:
// degraded until TryAgain finds Redis answering.
type sharedFake struct {
	*breaker.Topics
	redis    *bool // whether Redis answers
	degraded bool
	tries    int
}

func (b *sharedFake) Degraded() bool { return b.degraded }

func (b *sharedFake) TryAgain() bool {
	b.tries++
	b.degraded = !*b.redis
	return true
}

// While Redis does not answer, a pass of the fleet tries one degraded
// breaker, not every one: they share the Redis, and a hung one would cost
// each its call's timeout, a thousand tenants' in turn. Once it answers,
// one pass brings every one back.
func TestDegradedBreakersTryRedisOneAPassWhileItIsDown(t *testing.T) {
	// The shared breakers as Fleet.add keeps them apart (the end-to-end
	// path: test/tenants_test.go's TestSchemasRelayOnThroughARedisOutage).
	f := &Fleet{members: map[string]*member{}, shared: map[string]sharedBreaker{}}
	redis := false
	var fakes []*sharedFake
	for i := range 5 {
		b := &sharedFake{Topics: breaker.New(breaker.Settings{}), redis: &redis, degraded: true}
		key := fmt.Sprintf("tenant_%d.outbox", i)
		f.members[key] = &member{}
		f.shared[key] = b
		fakes = append(fakes, b)
	}
	tries := func() (n int) {
		for _, b := range fakes {
			n += b.tries
		}
		return n
	}
	require.True(t, f.breakersTryAgain(), "shared breakers: the fleet looks again in a second")
	require.Equal(t, 1, tries(), "Redis down: one breaker tried")
	f.breakersTryAgain()
	require.Equal(t, 2, tries())

	redis = true
	f.breakersTryAgain()
	for i, b := range fakes {
		require.False(t, b.Degraded(), "breaker %d still on local state", i)
	}
	before := tries()
	f.breakersTryAgain()
	require.Equal(t, before, tries(), "none degraded, none tried")

	// A fleet without Redis has no breaker to try, and no reason to wake
	// every second.
	local := &Fleet{members: f.members}
	require.False(t, local.breakersTryAgain())
	require.Equal(t, before, tries())
}

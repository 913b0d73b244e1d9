package breaker

// Breaker is what the sweeper needs of a per-topic breaker, and what operators
// use to steer it. [Topics] keeps the state in memory, [Redis] shares it among
// sweeper instances.
//
// No method returns an error: a breaker whose store is unreachable falls back
// to what it knows locally, since a breaker must never become a reason to stop
// relaying.
type Breaker interface {
	// OnTick advances the cooldowns by one tick. The sweeper calls it at the
	// start of every tick.
	OnTick()
	// Plan says which topics the sweep leaves out and which it tries once.
	Plan() Plan
	// Success and Failure report a batch's outcome with the topic's generation
	// from the plan the batch was sent under.
	Success(topic string, gen uint64)
	Failure(topic string, gen uint64, topicClass bool, errText string)
	// Trip and Reset are the operator's: trip a topic for its cooldown, or close
	// it at once.
	Trip(topic, reason string)
	Reset(topic string)
	// Tripped lists the topics that are not closed; State tells one topic's.
	Tripped() []TopicStatus
	State(topic string) State
}

var _ Breaker = (*Topics)(nil)

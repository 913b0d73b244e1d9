package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// The dependency breaker guards a producer: ask it before each send and give
// it the verdict after. Sends judged the broker's fault in a row open it, and
// while it is open nothing is sent (the sweeper leaves the rows where they
// are, uncharged) until a trial after OpenDuration succeeds.
func ExampleDependency() {
	d := breaker.NewDependency(breaker.DependencyConfig{Failures: 2, OpenDuration: time.Minute})
	defer d.Close(context.Background())
	prod := memory.New(memory.Config{})
	prod.FailTopic("orders", errors.New("connection refused")) // as if the broker were down

	send := func(b producer.Batch) {
		done, err := d.Allow()
		if err != nil {
			fmt.Println("not sent:", err)
			return
		}
		err = prod.Send(context.Background(), b)
		if err != nil {
			done(breaker.BrokerDown, err) // the sweeper's failure policy decides this
			fmt.Println("failed:", err)
			return
		}
		done(breaker.BrokerUp, nil)
	}
	b := producer.Batch{Topic: "orders", Messages: []producer.Message{{ID: 1, Topic: "orders", Payload: []byte("x")}}}
	for range 3 {
		send(b)
	}
	fmt.Println("breaker:", d.State())
	// Output:
	// failed: connection refused
	// failed: connection refused
	// not sent: local failure: broker circuit breaker is open: nothing sent (circuit breaker is open)
	// breaker: open
}

// The topic breaker trips a topic whose destination is wrong (a topic-class
// failure) at once, and one that keeps failing after Threshold failures in
// the window; the sweeper leaves a tripped topic's rows for its cooldown, in
// ticks, and then sends one trial batch.
func ExampleTopics() {
	b := breaker.New(breaker.Settings{CooldownTicks: 2,
		OnStateChange: func(topic string, from, to breaker.State, reason string) {
			fmt.Printf("%s: %s → %s (%s)\n", topic, from, to, reason)
		}})
	plan := b.Plan()
	b.Failure("orders", plan.Gen("orders"), true, "queue orders does not exist")
	for range 3 { // ticks
		b.OnTick()
	}
	plan = b.Plan()
	fmt.Println("trial for orders:", plan.Trials["orders"])
	b.Success("orders", plan.Gen("orders"))
	// Output:
	// orders: closed → tripped (topic-class failure: queue orders does not exist)
	// orders: tripped → half-open (cooldown over)
	// trial for orders: true
	// orders: half-open → closed (trial batch succeeded)
}

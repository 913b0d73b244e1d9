// Package breaker holds the sweeper's per-topic circuit breaker: the outbox
// ADR's answer to one failing topic stalling the others.
//
// [Topics] counts failed batches per topic. A topic that fails often enough
// within a window, or fails with a topic-class error (the destination itself is
// wrong), is tripped: the sweeper leaves it out of paging, in SQL, so its rows
// cost nothing while it cools down. Cooldowns are counted in ticks, not time, so
// they stretch and shrink with the sweeper's schedule: OnTick, at the start of
// every tick, moves each tripped topic one tick closer to half-open, and a
// half-open topic gets one trial batch. See [Topics] for the state diagram.
//
// [Redis] shares the same breaker among sweeper instances, with a local
// [Topics] to fall back on while Redis does not answer. Both satisfy [Breaker],
// the interface the sweeper takes.
//
// [Dependency] is the broker circuit breaker (sony/gobreaker's two-step
// breaker), which stops all sends while the broker is down; the sweeper asks it
// before each send and tells it its verdict after. [Retry] is the in-call retry
// of one send, with exponential backoff and full jitter. This package never
// imports package outbox.
package breaker

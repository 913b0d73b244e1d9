package outbox

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5"
)

// AwakeLock exposes the awake lock to the external tests, which need the
// database helpers that the package's own tests cannot import.
type AwakeLock struct{ a *awakeLock }

func NewAwakeLock(connConfig *pgx.ConnConfig, t Table) AwakeLock {
	return AwakeLock{newAwakeLock(connConfig, t.WithDefaults(), slog.New(slog.DiscardHandler))}
}

func (l AwakeLock) Acquire(ctx context.Context) bool { return l.a.acquire(ctx) }
func (l AwakeLock) Release(ctx context.Context) (running string, held bool) {
	return l.a.release(ctx)
}
func (l AwakeLock) Settled(ctx context.Context, snapshot string) bool {
	return l.a.settled(ctx, snapshot)
}
func (l AwakeLock) Close() { l.a.close() }

// AwakeKeyOf is the awake lock's key for t.
func AwakeKeyOf(t Table) int64 { return awakeKey(t.WithDefaults()) }

// TxSettings is the statement that sets a page transaction's planner settings.
const TxSettings = txSettings

// MaxLockedTopics bounds the topic locks one transaction holds.
const MaxLockedTopics = maxLockedTopics

package admin

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/outbox-sweeper/sweeper/outbox"
)

// healthz answers whether the process should be restarted: only when its
// sweep loop is wedged. A database or a broker that is down is not cured by a
// restart: /readyz and GET /status report those.
func (a *api) healthz(w http.ResponseWriter, _ *http.Request) {
	if a.cfg.Stalled != nil {
		now := time.Now()
		if st, stalled := a.cfg.Stalled(now); stalled {
			last := "no sweep has completed since the sweeper started"
			if !st.LastSweep.IsZero() {
				last = fmt.Sprintf("the last one completed at %s", st.LastSweep.UTC().Format(time.RFC3339))
			}
			a.cfg.Logger.Error("health check failed: the sweep loop is stalled", "sweep_began_at", st.Since, "progress_at", st.Progress, "ticks", st.Ticks)
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "stalled", "reason": fmt.Sprintf(
				"the sweep that began at %s has made no progress (no statement and no send has returned) for %s, "+
					"more than %d ticks (--stall-ticks) and %s (twice the send timeout plus 5s); %s. "+
					"Something blocks it (a statement waiting on a lock, a broker call that ignores its timeout): "+
					"restarting the process frees it; before that, SIGQUIT prints its goroutines to stderr",
				st.Since.UTC().Format(time.RFC3339), now.Sub(st.Progress).Round(time.Second), st.MaxTicks, st.Limit, last)})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (a *api) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	// Reasons are short: /readyz needs no token, and database errors name
	// hosts and users. The full error goes to the log.
	if err := a.cfg.Pool.Ping(ctx); err != nil {
		a.cfg.Logger.Warn("not ready: database unreachable", "err", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "database unreachable (see the sweeper's log)"})
		return
	}
	v, err := outbox.CurrentSchemaVersion(ctx, a.cfg.Pool, a.cfg.Table)
	if err != nil {
		a.cfg.Logger.Warn("not ready: cannot read the schema version", "err", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "cannot read the schema version (see the sweeper's log)"})
		return
	}
	// Older only: a schema a newer sweeper migrated (migrate, then deploy;
	// or a rollback of the binary) serves this one, as the relay of many
	// takes it; refused, every pod of the older binary stayed unready
	// (an independent review, 2026-11-29).
	if want := outbox.SchemaVersion(); v < want {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable",
			"reason": fmt.Sprintf("schema version %d, want %d: run `sweeper migrate`", v, want)})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

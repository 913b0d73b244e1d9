package admin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/outbox-sweeper/sweeper/breaker"
)

func (a *api) breakerState(w http.ResponseWriter, _ *http.Request) {
	if a.cfg.Dependency == nil {
		writeJSON(w, http.StatusOK, map[string]any{"state": "none"})
		return
	}
	writeJSON(w, http.StatusOK, a.brokerBreaker())
}

// brokerBreaker is the broker breaker's state as GET /breaker shows it.
func (a *api) brokerBreaker() map[string]any {
	d := a.cfg.Dependency
	st, c := d.State(), d.Counts()
	out := map[string]any{"state": st.String(), "state_value": int(st), "counts": map[string]uint32{
		"requests": c.Requests, "total_successes": c.TotalSuccesses, "total_failures": c.TotalFailures,
		"consecutive_successes": c.ConsecutiveSuccesses, "consecutive_failures": c.ConsecutiveFailures}}
	if reason := d.Tripped(); reason != "" {
		out["tripped_by_hand"] = reason
	}
	return out
}

// readReason reads a trip's body, {"reason": "…"} or nothing, and returns the
// reason ("tripped through the admin API" when none is given).
func readReason(r *http.Request) (string, error) {
	var body struct {
		Reason string `json:"reason"`
	}
	raw, err := readBody(r)
	if err != nil {
		return "", err
	}
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &body); err != nil {
			return "", fmt.Errorf("body is not JSON like {\"reason\": \"…\"}: %v", err)
		}
	}
	if err := checkText("reason", body.Reason, "write it as UTF-8 text"); err != nil {
		return "", err
	}
	if body.Reason == "" {
		return "tripped through the admin API", nil
	}
	return body.Reason, nil
}

// breakerTrip opens the broker breaker by hand until a reset: nothing is
// sent, and nothing charged, while the broker is known to be going away.
func (a *api) breakerTrip(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Dependency == nil {
		writeJSON(w, http.StatusNotFound, errorBody{"this sweeper has no broker breaker"})
		return
	}
	reason, err := readReason(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	before := a.cfg.Dependency.State()
	a.cfg.Dependency.Trip(reason)
	a.audit(r, "broker breaker trip", "reason", reason, "previous_state", before.String())
	a.brokerChanged(w, before)
}

func (a *api) breakerReset(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Dependency == nil {
		writeJSON(w, http.StatusNotFound, errorBody{"this sweeper has no broker breaker"})
		return
	}
	before := a.cfg.Dependency.State()
	a.cfg.Dependency.Reset()
	a.audit(r, "broker breaker reset", "previous_state", before.String())
	a.brokerChanged(w, before)
}

// brokerChanged answers a broker breaker trip or reset with its state and the
// state before.
func (a *api) brokerChanged(w http.ResponseWriter, before breaker.DependencyState) {
	out := a.brokerBreaker()
	out["previous_state"] = before.String()
	writeJSON(w, http.StatusOK, out)
}

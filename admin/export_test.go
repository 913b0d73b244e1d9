package admin

import (
	"log/slog"
	"net/http"
	"strings"

	"github.com/outbox-sweeper/sweeper/outbox"
)

// RoutePatterns returns the patterns the API serves with every optional
// endpoint on.
func RoutePatterns() []string {
	a := &api{cfg: Config{Metrics: http.NotFoundHandler(), Backoffs: func() []outbox.TopicBackoff { return nil }, UI: true}}
	var out []string
	for _, r := range a.routes() {
		// The mux's {$} anchors / to itself; the document writes it /.
		out = append(out, strings.Replace(r.pattern, "/{$}", "/", 1))
	}
	return out
}

// FleetRoutePatterns returns the patterns a fleet's API serves with every
// optional endpoint on; the outboxes' subtree, served for any method, as
// the GET and POST the description gives it.
func FleetRoutePatterns() []string {
	f := &fleetAPI{cfg: FleetConfig{Base: Config{Metrics: http.NotFoundHandler(), UI: true}}, api: &api{}}
	var out []string
	for _, r := range f.routes() {
		p := strings.Replace(r.pattern, "/{$}", "/", 1)
		if strings.HasPrefix(p, "/") {
			out = append(out, "GET "+p, "POST "+p)
			continue
		}
		out = append(out, p)
	}
	return out
}

// Unreachable is unreachable, for its table of errors.
var Unreachable = unreachable

// Internal answers err as the API answers a call that failed on it.
func Internal(w http.ResponseWriter, r *http.Request, err error) {
	(&api{cfg: Config{Logger: slog.New(slog.DiscardHandler)}}).internal(w, r, err)
}

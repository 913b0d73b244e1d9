package admin

import (
	"net/http"

	"github.com/outbox-sweeper/sweeper/outbox"
)

// RoutePatterns returns the patterns the API serves with every optional
// endpoint on.
func RoutePatterns() []string {
	a := &api{cfg: Config{Metrics: http.NotFoundHandler(), Backoffs: func() []outbox.TopicBackoff { return nil }}}
	var out []string
	for _, r := range a.routes() {
		out = append(out, r.pattern)
	}
	return out
}

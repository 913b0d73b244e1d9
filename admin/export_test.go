package admin

import (
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

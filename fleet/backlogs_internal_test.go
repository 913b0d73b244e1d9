package fleet

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A failure to read the backlogs, met at every scrape while it lasts, is
// logged once a minute, with the error (which names the database).
func TestBacklogWarningLogsOnceAMinute(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	var w backlogWarning
	err := errors.New(`database "tenants_eu": read the outboxes' row estimates: permission denied`)
	for range 4 {
		w.warn(logger, err)
	}
	require.Equal(t, 1, strings.Count(buf.String(), "\n"), "four scrapes within a minute: %s", buf.String())
	require.Contains(t, buf.String(), "tenants_eu")
	require.Contains(t, buf.String(), "permission denied")
	w.logged = w.logged.Add(-time.Minute) // a minute on
	w.warn(logger, err)
	require.Equal(t, 2, strings.Count(buf.String(), "\n"), "a minute later: %s", buf.String())
}

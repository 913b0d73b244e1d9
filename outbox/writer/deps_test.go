package writer_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// An application that writes messages links pgx and nothing else of ours: the
// modules this package builds from are pgx's and this one. docs/writing.md
// ("From Go") shows the same list.
func TestTheWriterLinksPgxAlone(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	var modules []string
	for _, m := range strings.Fields(string(out)) {
		if !slices.Contains(modules, m) {
			modules = append(modules, m)
		}
	}
	slices.Sort(modules)
	require.Equal(t, []string{
		"github.com/jackc/pgpassfile", "github.com/jackc/pgservicefile", "github.com/jackc/pgx/v5", // pgx and its own
		"github.com/outbox-sweeper/sweeper", // this package and its SQL
		"golang.org/x/text",                 // pgx's
	}, modules)
}

// Package sql holds the statements the outbox store runs, one readable file per
// statement, embedded into the binary. A statement names its table as {{outbox}}
// (or {{dead_letter}}, {{probe}}, {{history}}); the store fills in the quoted, schema-qualified names once,
// when it is created, so no SQL is put together at run time.
//
// The examples/ folder has plain SQL for applications that are not written in Go.
package sql

import (
	"embed"
	"fmt"
	"strings"
)

//go:embed *.sql
var files embed.FS

// Tables holds the quoted, schema-qualified names a statement's placeholders
// stand for. A statement that does not use a placeholder needs no name for it.
type Tables struct {
	Outbox     string // {{outbox}}
	DeadLetter string // {{dead_letter}}
	Probe      string // {{probe}}, the dead-letter probe's watermark
	History    string // {{history}}, the dispatched rows (migration 10)
	// HistoryDefault is {{history_default}}, the history table's DEFAULT
	// partition.
	HistoryDefault string
}

// Statement returns the statement in file name (without ".sql"), with its
// placeholders replaced by t's names. It panics on a name that does not exist:
// the names are constants of this module.
func Statement(name string, t Tables) string {
	b, err := files.ReadFile(name + ".sql")
	if err != nil {
		panic(fmt.Sprintf("sql: no statement %q: %v", name, err))
	}
	return strings.NewReplacer("{{outbox}}", t.Outbox, "{{dead_letter}}", t.DeadLetter, "{{probe}}", t.Probe, "{{history_default}}", t.HistoryDefault, "{{history}}", t.History).Replace(string(b))
}

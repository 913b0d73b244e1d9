// Package sql holds the statements the outbox store runs, one readable file per
// statement, embedded into the binary. A statement names its table as {{outbox}}
// (or {{dead_letter}}); the store fills in the quoted, schema-qualified names once,
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

// Statement returns the statement in file name (without ".sql"), with {{outbox}}
// and {{dead_letter}} replaced by the given quoted identifiers. It panics on a name
// that does not exist: the names are constants of this module.
func Statement(name, outbox, deadLetter string) string {
	b, err := files.ReadFile(name + ".sql")
	if err != nil {
		panic(fmt.Sprintf("sql: no statement %q: %v", name, err))
	}
	return strings.NewReplacer("{{outbox}}", outbox, "{{dead_letter}}", deadLetter).Replace(string(b))
}

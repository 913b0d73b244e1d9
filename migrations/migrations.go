// Package migrations holds the versioned schema of the outbox, embedded into the
// binary. Files are tern migrations: numbered, one per version, the up part above
// the "---- create above / drop below ----" line and the down part below it. They
// are text/template files: the sweeper fills in the quoted table names, so one
// database can hold several outboxes (and each test its own schema).
package migrations

import "embed"

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS

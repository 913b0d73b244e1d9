package outbox

import (
	"github.com/jackc/pgx/v5"

	"github.com/outbox-sweeper/sweeper/outbox/writer"
	outboxsql "github.com/outbox-sweeper/sweeper/sql"
)

// The writer's types, which package writer holds so that an application that
// only writes messages links pgx and nothing of the sweeper. They are the
// same types under both names.
type (
	// Table names an outbox: see [writer.Table].
	Table = writer.Table
	// Message is a message an application writes: see [writer.Message].
	Message = writer.Message
	// Writer writes messages to one outbox: see [writer.Writer].
	Writer = writer.Writer
	// DBTX is what Writer.Write needs of a pgx handle: see [writer.DBTX].
	DBTX = writer.DBTX
	// SQLDB is what Writer.WriteSQL needs of a database/sql handle: see
	// [writer.SQLDB].
	SQLDB = writer.SQLDB
	// DuplicateMessageIDError: see [writer.DuplicateMessageIDError].
	DuplicateMessageIDError = writer.DuplicateMessageIDError
	// ConfigError reports a configuration value the sweeper does not accept,
	// naming its flag: see [writer.ConfigError].
	ConfigError = writer.ConfigError
)

// Defaults for [Table], and the writer's switch to COPY.
const (
	SchemaDefault        = writer.SchemaDefault
	TableDefault         = writer.TableDefault
	CopyThresholdDefault = writer.CopyThresholdDefault
)

// NewWriter returns a writer for table t (zero fields take their defaults). It
// is [writer.New].
func NewWriter(t Table) (*Writer, error) { return writer.New(t) }

// probeIdent returns the quoted name of the table that holds the dead-letter
// probe's watermark.
func probeIdent(t Table) string { return pgx.Identifier{t.Schema, t.Name + "_probe"}.Sanitize() }

// historyName returns the bare name of t's history table, which holds the
// dispatched rows (migration 10).
func historyName(t Table) string { return t.Name + "_history" }

// HistoryIdent returns the quoted name of t's history table, which holds the
// sent rows (migration 10), for what looks at it beside the sweeper (a
// fleet checking it is there).
func HistoryIdent(t Table) string { return pgx.Identifier{t.Schema, historyName(t)}.Sanitize() }

// historyDefaultIdent returns the quoted name of the DEFAULT partition of t's
// history table.
func historyDefaultIdent(t Table) string {
	return pgx.Identifier{t.Schema, historyName(t) + "_default"}.Sanitize()
}

// statement returns the named statement of package sql for t's tables.
func statement(t Table, name string) string {
	return outboxsql.Statement(name, outboxsql.Tables{Outbox: t.Ident(), DeadLetter: t.DeadLetterIdent(), Probe: probeIdent(t),
		History: HistoryIdent(t), HistoryDefault: historyDefaultIdent(t)})
}

// versionTable returns the name of the table where the migrations record the
// schema version. It belongs to one outbox, so two outboxes in one schema migrate
// independently. It is not quoted: tern looks the table up by splitting the name
// at the dot, and Validate has made sure no quoting is needed.
func versionTable(t Table) string { return t.Schema + "." + versionName(t) }

// versionName returns the bare name of the table where t's migrations
// record its schema version.
func versionName(t Table) string { return t.Name + "_schema_version" }

// VersionIdent returns the quoted name of the table where t's migrations
// record its schema version, for messages that tell an operator to set it.
func VersionIdent(t Table) string { return pgx.Identifier{t.Schema, versionName(t)}.Sanitize() }

func configError(what, flag, value, want string) *ConfigError {
	return &ConfigError{What: what, Flag: flag, Value: value, Want: want}
}

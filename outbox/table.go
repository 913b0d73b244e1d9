package outbox

import (
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"

	outboxsql "github.com/outbox-sweeper/sweeper/sql"
)

// Defaults for [Table].
const (
	SchemaDefault = "public"
	TableDefault  = "outbox"
)

// maxTableName leaves room for the longest suffix the migrations add to the table
// name ("_dead_letter_topic_idx", 22 bytes) within Postgres's 63-byte identifiers.
const maxTableName = 63 - 22

// identPattern is deliberately narrow: lower-case names need no quoting in
// hand-written SQL, and an operator typing psql at 3 a.m. should not have to
// remember that "Outbox" and outbox are different tables.
var identPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// Table names an outbox: a schema and a table. The dead-letter table is the
// outbox's name with "_dead_letter" appended, in the same schema.
type Table struct {
	// Schema is the schema holding the tables. Defaults to SchemaDefault.
	Schema string
	// Name is the outbox table's name. Defaults to TableDefault.
	Name string
}

// WithDefaults returns t with empty fields filled in.
func (t Table) WithDefaults() Table {
	if t.Schema == "" {
		t.Schema = SchemaDefault
	}
	if t.Name == "" {
		t.Name = TableDefault
	}
	return t
}

// Validate reports a schema or table name the sweeper does not accept.
func (t Table) Validate() error {
	if !identPattern.MatchString(t.Schema) || len(t.Schema) > 63 {
		return &ConfigError{What: "schema", Flag: "schema", Value: fmt.Sprintf("%q", t.Schema),
			Want: "not a valid name: use lower-case letters, digits and _, starting with a letter or _, at most 63 bytes"}
	}
	if !identPattern.MatchString(t.Name) || len(t.Name) > maxTableName {
		return &ConfigError{What: "table", Flag: "table", Value: fmt.Sprintf("%q", t.Name),
			Want: fmt.Sprintf("not a valid name: use lower-case letters, digits and _, starting with a letter or _, at most %d bytes", maxTableName)}
	}
	return nil
}

// TopicLockKey returns the advisory lock key that a sweeper holds, under
// OrderingTopic, while it sends a batch of topic from t. An operator finds who
// sends a topic in pg_locks (locktype 'advisory', with classid and objid the
// key's high and low 32 bits).
func (t Table) TopicLockKey(topic string) int64 {
	return advisoryKey("outbox-sweeper topic " + t.String() + " " + topic)
}

// String returns the schema-qualified outbox table name, as in logs.
func (t Table) String() string { return t.Schema + "." + t.Name }

// DeadLetterName returns the dead-letter table's bare name.
func (t Table) DeadLetterName() string { return t.Name + "_dead_letter" }

// ident returns the quoted, schema-qualified outbox table name for SQL.
func (t Table) ident() string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

// deadLetterIdent returns the quoted dead-letter table name for SQL.
func (t Table) deadLetterIdent() string {
	return pgx.Identifier{t.Schema, t.DeadLetterName()}.Sanitize()
}

// probeIdent returns the quoted name of the table that holds the dead-letter
// probe's watermark.
func (t Table) probeIdent() string { return pgx.Identifier{t.Schema, t.Name + "_probe"}.Sanitize() }

// statement returns the named statement of package sql for t's tables.
func (t Table) statement(name string) string {
	return outboxsql.Statement(name, outboxsql.Tables{Outbox: t.ident(), DeadLetter: t.deadLetterIdent(), Probe: t.probeIdent()})
}

// versionTable returns the name of the table where the migrations record the
// schema version. It belongs to one outbox, so two outboxes in one schema migrate
// independently. It is not quoted: tern looks the table up by splitting the name
// at the dot, and Validate has made sure no quoting is needed.
func (t Table) versionTable() string {
	return t.Schema + "." + t.Name + "_schema_version"
}

package writer

import (
	"fmt"
	"hash/fnv"
	"regexp"

	"github.com/jackc/pgx/v5"
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
// ordering by topic, while it sends a batch of topic from t. An operator finds
// who sends a topic in pg_locks (locktype 'advisory', with classid and objid
// the key's high and low 32 bits).
func (t Table) TopicLockKey(topic string) int64 {
	return AdvisoryKey("outbox-sweeper topic " + t.String() + " " + topic)
}

// AdvisoryKey is the advisory lock key the sweeper derives from s: FNV-1a,
// 64 bits. Its locks are the sweeper's, not the writers' (WriteOrdered takes
// Postgres's hashtextextended, which applications in other languages can
// compute in SQL).
func AdvisoryKey(s string) int64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return int64(h.Sum64())
}

// String returns the schema-qualified outbox table name, as in logs.
func (t Table) String() string { return t.Schema + "." + t.Name }

// DeadLetterName returns the dead-letter table's bare name.
func (t Table) DeadLetterName() string { return t.Name + "_dead_letter" }

// Ident returns the quoted, schema-qualified outbox table name, for SQL.
func (t Table) Ident() string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

// DeadLetterIdent returns the quoted, schema-qualified dead-letter table name,
// for SQL.
func (t Table) DeadLetterIdent() string {
	return pgx.Identifier{t.Schema, t.DeadLetterName()}.Sanitize()
}

// MessageIDIndex names the unique index on the outbox's message_id (migration
// 005), as Postgres names it in a unique violation.
func (t Table) MessageIDIndex() string { return t.Name + "_message_id_key" }

// ConfigError reports a configuration value the sweeper does not accept. It names
// the field's command-line flag, so the binary can say which flag or environment
// variable to fix.
type ConfigError struct {
	// What is the setting in words, e.g. "page size".
	What string
	// Flag is the sweeper binary's flag for it, e.g. "page-size".
	Flag string
	// Value is the rejected value as the user would write it.
	Value string
	// Want says what is accepted.
	Want string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%s (--%s) is %s: %s", e.What, e.Flag, e.Value, e.Want)
}

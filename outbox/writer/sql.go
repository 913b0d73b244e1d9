package writer

import outboxsql "github.com/outbox-sweeper/sweeper/sql"

// statement returns the named statement of package sql for t's outbox.
func statement(t Table, name string) string {
	return outboxsql.Statement(name, outboxsql.Tables{Outbox: t.Ident()})
}

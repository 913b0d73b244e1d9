package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/outbox-sweeper/sweeper/outbox"
)

// migratePrintOptions are the flags of `sweeper migrate print`, which needs
// no database.
type migratePrintOptions struct {
	schema, table string
	from          int
	noTx          bool
}

func migratePrintFlags(o *migratePrintOptions) *flags {
	f := newFlags("migrate print")
	f.String(&o.schema, "schema", outbox.SchemaDefault, "name", "schema of the outbox table")
	f.String(&o.table, "table", outbox.TableDefault, "name", "outbox table name")
	f.Int(&o.from, "from", 0, "print the steps after this schema version only (what an upgrade from it applies; `sweeper migrate status` says a database's)")
	f.bool(&o.noTx, "no-transaction", "leave out BEGIN/COMMIT around each step, for tools that run each file in a transaction of their own")
	return f
}

// migratePrintCommand writes the schema's SQL for a table, with its names
// filled in, for goose, Atlas, Flyway, Liquibase or a DBA's review.
func migratePrintCommand(_ context.Context, o *migratePrintOptions, f *flags, out, _ io.Writer) error {
	t := outbox.Table{Schema: o.schema, Name: o.table}
	if err := t.Validate(); err != nil {
		return f.configError(err)
	}
	if latest := int(outbox.SchemaVersion()); o.from < 0 || o.from > latest {
		return usagef("%s is %d: the schema has versions 0 to %d", f.origin("from"), o.from, latest)
	}
	script, err := outbox.MigrationScript(t, int32(o.from), !o.noTx)
	if err != nil {
		return err
	}
	_, err = io.WriteString(out, script)
	return err
}

func migrateStatusFlags(c *common) *flags {
	f := newFlags("migrate status")
	c.register(f)
	return f
}

// migrateStatusCommand says which schema version a database's outbox is at
// and what `sweeper migrate` would apply. It changes nothing.
func migrateStatusCommand(ctx context.Context, c *common, f *flags, out, _ io.Writer) error {
	conn, tbl, err := c.connect(ctx, f)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	st, err := outbox.CheckMigrations(ctx, conn, tbl)
	if err != nil {
		return err
	}
	switch {
	case st.Current > st.Latest:
		fmt.Fprintf(out, "%s is at schema version %d, newer than this sweeper's %d (a newer sweeper migrated it): `sweeper migrate` has nothing to apply, "+
			"and this sweeper relays it as it is\n", tbl, st.Current, st.Latest)
	case len(st.Pending) == 0:
		fmt.Fprintf(out, "%s is at schema version %d, the newest: `sweeper migrate` has nothing to apply\n", tbl, st.Current)
	case st.Current == 0:
		fmt.Fprintf(out, "%s is not migrated (version 0 of %d): `sweeper migrate` would create it with:\n", tbl, st.Latest)
	default:
		fmt.Fprintf(out, "%s is at schema version %d of %d: `sweeper migrate` would apply:\n", tbl, st.Current, st.Latest)
	}
	for _, m := range st.Pending {
		fmt.Fprintf(out, "  %d  %s\n", m.Version, m.Name)
	}
	return nil
}

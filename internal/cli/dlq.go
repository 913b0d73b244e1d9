package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-sweeper/sweeper/outbox"
)

// dlqOptions are the flags of the dlq commands.
type dlqOptions struct {
	common
	cmd         string // list, replay or purge
	all         bool
	dryRun      bool
	ids         string
	jsonOut     bool
	limit       int
	olderThan   time.Duration
	reason      string
	showPayload bool
	since       time.Duration
	topic       string
}

// dlqFlags returns the flag set maker of dlq cmd.
func dlqFlags(cmd string) func(*dlqOptions) *flags {
	return func(o *dlqOptions) *flags { return o.flags(cmd) }
}

func (o *dlqOptions) flags(cmd string) *flags {
	o.cmd = cmd
	f := newFlags("dlq " + cmd)
	o.common.register(f)
	f.String(&o.topic, "topic", "", "topic", "only dead letters of this topic")
	f.String(&o.reason, "reason", "", "reason", "only dead letters with this reason (max_retries_exceeded, message_too_large, invalid_message, expired, …)")
	if cmd != "purge" { // purge selects by age with --older-than only: --since would purge the newest
		f.Duration(&o.since, "since", 0, "only dead letters from the last duration, e.g. 24h (unset: any age)")
	}
	switch cmd {
	case "list":
		f.String(&o.ids, "id", "", "ids", "only these dead-letter ids, comma-separated")
		f.Int(&o.limit, "limit", 50, "most dead letters listed, newest first")
		f.bool(&o.jsonOut, "json", "one JSON object per line instead of a table")
		f.bool(&o.showPayload, "show-payload", "include payloads (base64) and headers: they may hold personal data")
	case "replay":
		f.String(&o.ids, "id", "", "ids", "dead-letter ids to replay, comma-separated")
		f.bool(&o.all, "all", "replay every dead letter")
		f.bool(&o.dryRun, "dry-run", "print how many would be replayed, replay nothing")
	case "purge":
		f.String(&o.ids, "id", "", "ids", "dead-letter ids to purge, comma-separated")
		f.Duration(&o.olderThan, "older-than", 0, "purge dead letters older than this, e.g. 720h")
		f.bool(&o.all, "all", "purge every dead letter")
		f.bool(&o.dryRun, "dry-run", "print how many would be purged, purge nothing")
	}
	for _, name := range []string{"topic", "reason", "since", "limit", "json", "show-payload", "id", "all", "older-than", "dry-run"} {
		f.noEnv[name] = true
	}
	return f
}

// filter builds the library's filter from the flags.
func (o *dlqOptions) filter(f *flags) (outbox.DeadLetterFilter, error) {
	flt := outbox.DeadLetterFilter{Topic: o.topic, Reason: o.reason, All: o.all}
	for _, v := range []struct{ name, value string }{{"topic", o.topic}, {"reason", o.reason}} {
		if p := textProblem(v.value); p != "" {
			return flt, usagef("%s %q %s; select the dead letters of a topic that is not UTF-8 by --id instead", f.origin(v.name), v.value, p)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		at   *time.Time
	}{{"since", o.since, &flt.Since}, {"older-than", o.olderThan, &flt.Before}} {
		if !f.set(d.name) {
			continue
		}
		if err := outbox.CheckAge(f.origin(d.name), d.v); err != nil {
			return flt, &usageError{msg: err.Error()}
		}
		*d.at = time.Now().Add(-d.v)
	}
	if strings.TrimSpace(o.ids) != "" {
		for _, s := range strings.Split(o.ids, ",") {
			id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			if err != nil { // 0 and below too: dead letters of reason invalid_id
				return flt, usagef("invalid value %q for %s: write ids as whole numbers separated by commas", o.ids, f.origin("id"))
			}
			flt.IDs = append(flt.IDs, id)
		}
	}
	return flt, nil
}

// dlqCommand runs `sweeper dlq list|replay|purge`.
func dlqCommand(ctx context.Context, o *dlqOptions, f *flags, out, errOut io.Writer) (err error) {
	cmd := o.cmd
	defer func() {
		// A table not there is an outbox not migrated, or another named:
		// say so, as run does, rather than Postgres's "does not exist" alone.
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "42P01" {
			err = fmt.Errorf("%w: is the outbox %s.%s migrated? run `sweeper migrate --schema %s --table %s` against this database, "+
				"or name the outbox with --schema, --table and --database-url", err, o.schema, o.table, o.schema, o.table)
		}
	}()
	tbl, err := o.tableName(f)
	if err != nil {
		return err
	}
	flt, err := o.filter(f)
	if err != nil {
		return err
	}
	if cmd == "list" && (o.limit < 1 || o.limit > 100_000) {
		return usagef("%s is %d: it must be between 1 and 100000", f.origin("limit"), o.limit)
	}
	poolCfg, err := o.poolConfig(f.origin("database-url"))
	if err != nil {
		return err
	}
	poolCfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()
	d, err := outbox.NewDeadLetters(pool, tbl)
	if err != nil {
		return &usageError{msg: err.Error()}
	}

	switch cmd {
	case "list":
		rows, err := d.List(ctx, flt, o.limit, o.showPayload)
		if err != nil {
			return err
		}
		if o.jsonOut {
			enc := json.NewEncoder(out)
			for _, r := range rows {
				if err := enc.Encode(r); err != nil {
					return err
				}
			}
			return nil
		}
		return printDeadLetters(out, rows, o.showPayload)
	case "replay":
		replay := d.Replay
		if o.dryRun {
			replay = d.Count
		}
		n, err := replay(ctx, flt)
		if errors.Is(err, outbox.ErrNoFilter) {
			return &usageError{msg: err.Error()}
		}
		if err != nil {
			return err
		}
		if o.dryRun {
			fmt.Fprintf(out, "would replay %d dead letters into %s (dry run: nothing replayed)\n", n, tbl)
		} else {
			audit(errOut, "dead letters replay", n, flt, tbl)
			fmt.Fprintf(out, "replayed %d dead letters into %s\n", n, tbl)
		}
	case "purge":
		n, err := d.Purge(ctx, flt, o.dryRun)
		if errors.Is(err, outbox.ErrNoFilter) {
			return &usageError{msg: err.Error()}
		}
		if err != nil {
			return err
		}
		if o.dryRun {
			fmt.Fprintf(out, "would purge %d dead letters from %s (dry run: nothing purged)\n", n, tbl.Schema+"."+tbl.DeadLetterName())
		} else {
			audit(errOut, "dead letters purge", n, flt, tbl)
			fmt.Fprintf(out, "purged %d dead letters from %s\n", n, tbl.Schema+"."+tbl.DeadLetterName())
		}
	}
	return nil
}

// audit writes the admin API's audit line for a change made from the shell
// straight to the database, which no sweeper sees: to stderr, for the
// terminal's history or whatever collects the job's output, with the OS user
// and host in place of the API's remote address and user agent.
func audit(w io.Writer, action string, n int, f outbox.DeadLetterFilter, tbl outbox.Table) {
	host, _ := os.Hostname()
	who := os.Getenv("USER")
	if u, err := user.Current(); err == nil {
		who = u.Username
	}
	args := []any{"action", action, "count", n, "table", tbl.String(), "user", who, "host", host, "via", "sweeper dlq"}
	for _, a := range []struct {
		k   string
		v   any
		set bool
	}{{"ids", f.IDs, len(f.IDs) > 0}, {"topic", f.Topic, f.Topic != ""}, {"reason", f.Reason, f.Reason != ""},
		{"since", f.Since, !f.Since.IsZero()}, {"before", f.Before, !f.Before.IsZero()}, {"all", f.All, f.All}} {
		if a.set {
			args = append(args, a.k, a.v)
		}
	}
	slog.New(slog.NewTextHandler(w, nil)).Info("admin action", args...)
}

func printDeadLetters(out io.Writer, rows []outbox.DeadLetter, payload bool) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	header := "ID\tTOPIC\tREASON\tATTEMPTS\tDEAD-LETTERED\tCORRELATION ID\tMESSAGE ID\tERROR"
	if payload {
		header += "\tPAYLOAD (base64)"
	}
	fmt.Fprintln(w, header)
	for _, r := range rows {
		line := fmt.Sprintf("%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s", r.ID, cell(r.Topic), r.Reason, r.Attempts,
			r.DeadLetteredAt.UTC().Format(time.DateTime), deref(r.CorrelationID), r.MessageID, oneLine(deref(r.Error), 80))
		if payload {
			line += "\t" + base64.StdEncoding.EncodeToString(r.Payload)
		}
		fmt.Fprintln(w, line)
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "(no dead letters)")
	}
	return w.Flush()
}

func deref(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

// oneLine shortens s to n runes on one line, for a table cell.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

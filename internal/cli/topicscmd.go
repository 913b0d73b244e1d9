package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/breaker"
)

// adminOptions are the flags of `sweeper topics` and `sweeper breaker`, which
// talk to a running sweeper's admin API.
type adminOptions struct {
	cmd            string // topics: list, trip or reset; breaker: status, trip or reset
	adminToken     string
	adminTokenFile string
	adminURL       string
	outbox         string
	jsonOut        bool
	reason         string
}

// topicsFlags returns the flag set maker of topics cmd.
func topicsFlags(cmd string) func(*adminOptions) *flags {
	return func(o *adminOptions) *flags { return o.flags(cmd) }
}

func (o *adminOptions) flags(cmd string) *flags {
	o.cmd = cmd
	f := newFlags("topics " + cmd)
	if cmd != "list" {
		f.operands = []string{"TOPIC"}
	}
	o.adminFlags(f)
	return f
}

// adminFlags registers the flags of the commands that call the admin API.
func (o *adminOptions) adminFlags(f *flags) {
	f.String(&o.adminURL, "admin-url", "http://"+admin.AddrDefault, "url", "the running sweeper's admin API")
	f.String(&o.outbox, "outbox", "", "name", "in a relay of many outboxes: the outbox the command concerns, named as GET /outboxes names it (its schema, or database.schema)")
	f.noEnv["outbox"] = true
	adminTokenFlags(f, &o.adminToken, &o.adminTokenFile, "its bearer token, if it has one")
	f.bool(&o.jsonOut, "json", "print the API's JSON instead of a table")
	f.noEnv["json"] = true
	if o.cmd == "trip" {
		f.String(&o.reason, "reason", "", "text", "why, shown in the list and the alert")
		f.noEnv["reason"] = true
	}
}

// topicsCommand runs `sweeper topics list|trip TOPIC|reset TOPIC`.
func topicsCommand(ctx context.Context, o *adminOptions, f *flags, out, _ io.Writer) error {
	cmd, topic := o.cmd, ""
	if len(f.args) > 0 {
		topic = f.args[0]
	}
	if p := textProblem(topic); cmd != "list" && p != "" {
		return usagef("topics %s: the topic %q %s; a topic that is not UTF-8 (rows of a SQL_ASCII database) cannot be tripped or reset by hand, "+
			"its breaker trips and recovers by itself", cmd, topic, p)
	}
	if !utf8.ValidString(o.reason) {
		// JSON would send it with U+FFFD in place of the bytes, without a word.
		return usagef("%s %q is not valid UTF-8: write the reason in UTF-8", f.origin("reason"), o.reason)
	}
	path, body := "/topics/tripped", map[string]string{}
	switch {
	case cmd == "list":
	case topic == "." || topic == "..":
		// A URL's "." and ".." segments mean this folder and the one above,
		// however escaped, so that such a path may never reach the API as
		// sent: these two go in the body.
		path, body["topic"] = "/topics/"+cmd, topic
	default:
		path = "/topics/" + url.PathEscape(topic) + "/" + cmd
	}
	raw, done, err := o.call(ctx, f, out, cmd != "list", path, body)
	if err != nil || done {
		return err
	}
	if cmd != "list" {
		var r struct{ Topic, State string }
		if err := json.Unmarshal(raw, &r); err != nil {
			return err
		}
		fmt.Fprintf(out, "topic %q is %s\n", r.Topic, r.State)
		return nil
	}
	var list struct {
		Tripped []breaker.TopicStatus `json:"tripped"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return fmt.Errorf("admin API answered something else than a topic list: %w", err)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TOPIC\tSTATE\tCOOLDOWN TICKS LEFT\tTRIPS\tTRIPPED AT\tLAST ERROR")
	for _, t := range list.Tripped {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\n", cell(t.Topic), t.State, t.CooldownTicksLeft, t.Trips,
			t.TrippedAt.UTC().Format(time.DateTime), oneLine(t.LastError, 80))
	}
	if len(list.Tripped) == 0 {
		fmt.Fprintln(w, "(no tripped topics)")
	}
	return w.Flush()
}

// call makes the command's call to path: a POST of fields and the reason, if
// any, as JSON when change is set, else a GET. With --json it prints the
// answer and reports done.
func (o *adminOptions) call(ctx context.Context, f *flags, out io.Writer, change bool, path string, fields map[string]string) (raw []byte, done bool, err error) {
	token, err := adminToken(f, o.adminToken, o.adminTokenFile)
	if err != nil {
		return nil, false, err
	}
	method, body := http.MethodGet, ""
	if change {
		method = http.MethodPost
		if fields == nil {
			fields = map[string]string{}
		}
		if o.reason != "" {
			fields["reason"] = o.reason
		}
		if len(fields) > 0 {
			b, _ := json.Marshal(fields)
			body = string(b)
		}
	}
	if o.outbox != "" {
		path = "/outboxes/" + url.PathEscape(o.outbox) + path
	}
	if raw, err = adminCall(ctx, f, o.adminURL, token, method, path, body); err != nil {
		return nil, false, err
	}
	if o.jsonOut {
		_, err := out.Write(raw)
		return raw, true, err
	}
	return raw, false, nil
}

// adminCall makes one call to a running sweeper's admin API at adminURL and
// returns the body of its 200 answer; any other answer is an error that says
// what the API said, and what to do about a missing token.
func adminCall(ctx context.Context, f *flags, adminURL, token, method, path, body string) ([]byte, error) {
	base, err := url.Parse(adminURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, usagef("invalid value %q for %s: write http://host:port", redactURL(adminURL), f.origin("admin-url"))
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(adminURL, "/")+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if method == http.MethodPost {
		// The API takes changes in JSON only, an empty body too: a web page
		// of another site cannot send that type (admin/guard.go).
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reach the admin API at %s (%s): %s (is the sweeper running, with its --admin-addr at that address?)",
			redactURL(adminURL), f.origin("admin-url"), redactIn(err.Error(), adminURL))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 10<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(raw, &e)
		if resp.StatusCode == http.StatusUnauthorized {
			return nil, fmt.Errorf("admin API: %s (give --admin-token, OUTBOX_ADMIN_TOKEN or --admin-token-file: the sweeper's)", e.Error)
		}
		return nil, fmt.Errorf("admin API answered %s: %s", resp.Status, e.Error)
	}
	return raw, nil
}

// textProblem says what is wrong with a topic or filter that no row can hold,
// or "" when nothing is: bytes that are not UTF-8, and NUL. A UTF8 database
// refuses both in a text parameter, and the admin API answers 400 to them, so
// the commands refuse them first, with exit 2 and a message that quotes them.
func textProblem(v string) string {
	switch {
	case !utf8.ValidString(v):
		return "is not valid UTF-8: topics and filters are UTF-8 text, as the outbox's text columns hold them"
	case strings.IndexByte(v, 0) >= 0:
		return "holds a NUL byte, which no Postgres text value can hold, so no row has it"
	}
	return ""
}

// cell returns s for a table cell, quoted (\xff, \n, \u200b) when it holds
// bytes that are not UTF-8 or characters a terminal would not show as written:
// a topic from a SQL_ASCII database, or one with control characters, must
// neither garble the table nor pass for another topic.
func cell(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"unicode/utf8"
)

// breakerFlags returns the flag set maker of `sweeper breaker cmd` (status,
// trip, reset), which talks to a running sweeper's admin API.
func breakerFlags(cmd string) func(*adminOptions) *flags {
	return func(o *adminOptions) *flags {
		o.cmd = cmd
		f := newFlags("breaker " + cmd)
		o.adminFlags(f)
		return f
	}
}

// breakerCommand runs `sweeper breaker status|trip|reset`.
func breakerCommand(ctx context.Context, o *adminOptions, f *flags, out, _ io.Writer) error {
	if !utf8.ValidString(o.reason) {
		return usagef("%s %q is not valid UTF-8: write the reason in UTF-8", f.origin("reason"), o.reason)
	}
	path := "/breaker"
	if o.cmd != "status" {
		path += "/" + o.cmd
	}
	raw, done, err := o.call(ctx, f, out, o.cmd != "status", path, nil)
	if err != nil || done {
		return err
	}
	var st struct {
		State         string            `json:"state"`
		TrippedByHand string            `json:"tripped_by_hand"`
		Counts        map[string]uint32 `json:"counts"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("admin API answered something else than the breaker's state: %w", err)
	}
	fmt.Fprintf(out, "broker breaker is %s", st.State)
	if st.TrippedByHand != "" {
		fmt.Fprintf(out, " (tripped by hand: %s; `sweeper breaker reset` closes it)", oneLine(st.TrippedByHand, 200))
	}
	if st.State != "none" {
		fmt.Fprintf(out, "; %d failures in a row", st.Counts["consecutive_failures"])
	}
	fmt.Fprintln(out)
	return nil
}

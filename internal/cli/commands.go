package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// command is one thing the binary does, as typed after "sweeper": "run",
// "dlq list", "topics trip".
type command struct {
	name    string
	summary string
	// parse reads the command's flags, variables and operands, and returns
	// what runs it. It returns the flag set even when it fails, so that
	// --help can print it; the docs' check of command lines (readme_test.go)
	// calls parse alone.
	parse func(args []string, env Env) (*flags, runFunc, error)
}

type runFunc func(ctx context.Context, out, errOut io.Writer) error

// bind makes a command's parse from its options' flags and its body.
func bind[O any](newFlags func(*O) *flags, run func(context.Context, *O, *flags, io.Writer, io.Writer) error) func([]string, Env) (*flags, runFunc, error) {
	return func(args []string, env Env) (*flags, runFunc, error) {
		o := new(O)
		f := newFlags(o)
		if err := f.parse(args, env); err != nil {
			return f, nil, err
		}
		return f, func(ctx context.Context, out, errOut io.Writer) error { return run(ctx, o, f, out, errOut) }, nil
	}
}

// commands lists every command; groups (dlq, topics) are the first word of
// several.
var commands = []command{
	{name: "run", summary: "relay outstanding rows until SIGINT or SIGTERM (the default command)",
		parse: bind((*runOptions).flags, runCommand)},
	{name: "migrate", summary: "create or upgrade the outbox tables; idempotent, safe to run concurrently",
		parse: bind(migrateFlags, migrateCommand)},
	{name: "migrate print", summary: "write the schema's SQL for a table, names filled in, for another migration tool or a review",
		parse: bind(migratePrintFlags, migratePrintCommand)},
	{name: "migrate status", summary: "say which schema version a database's outbox is at and what migrate would apply",
		parse: bind(migrateStatusFlags, migrateStatusCommand)},
	{name: "dlq list", summary: "list dead letters, newest first",
		parse: bind(dlqFlags("list"), dlqCommand)},
	{name: "dlq replay", summary: "move dead letters back to the outbox, to be sent again",
		parse: bind(dlqFlags("replay"), dlqCommand)},
	{name: "dlq purge", summary: "delete dead letters",
		parse: bind(dlqFlags("purge"), dlqCommand)},
	{name: "topics list", summary: "list tripped topics, through a running sweeper's admin API",
		parse: bind(topicsFlags("list"), topicsCommand)},
	{name: "topics trip", summary: "trip a topic by hand: it is left out of paging until reset or its cooldown ends",
		parse: bind(topicsFlags("trip"), topicsCommand)},
	{name: "topics reset", summary: "close a tripped topic now: it is sent at the next sweep",
		parse: bind(topicsFlags("reset"), topicsCommand)},
	{name: "breaker status", summary: "the broker circuit breaker's state, through a running sweeper's admin API",
		parse: bind(breakerFlags("status"), breakerCommand)},
	{name: "breaker trip", summary: "open the broker breaker by hand: nothing is sent, and nothing charged, until reset",
		parse: bind(breakerFlags("trip"), breakerCommand)},
	{name: "breaker reset", summary: "close the broker breaker now, whether it opened by itself or by hand",
		parse: bind(breakerFlags("reset"), breakerCommand)},
	{name: "healthcheck", summary: "exit 0 when the sweeper's admin API answers /healthz, 1 otherwise (a container's HEALTHCHECK)",
		parse: bind(healthcheckFlags, healthcheckCommand)},
}

// lookup finds the command args start with, and returns the arguments after
// its name. No name, or a flag first, is run.
func lookup(args []string) (*command, []string, error) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return &commands[0], args, nil
	}
	group := subcommands(args[0])
	if len(group) == 0 {
		for i := range commands {
			if commands[i].name == args[0] {
				return &commands[i], args[1:], nil
			}
		}
		return nil, nil, usagef("unknown command %q: the commands are %s, version and help", args[0], strings.Join(topNames(), ", "))
	}
	if len(args) > 1 {
		for _, c := range group {
			if c.name == args[0]+" "+args[1] {
				return c, args[2:], nil
			}
		}
	}
	for i := range commands { // a group's word that is a command too (migrate)
		if commands[i].name == args[0] {
			return &commands[i], args[1:], nil
		}
	}
	var subs []string
	for _, c := range group {
		subs = append(subs, strings.TrimPrefix(c.name, args[0]+" "))
	}
	if len(args) == 1 || strings.HasPrefix(args[1], "-") {
		return nil, nil, usagef("%s needs a command: %s", args[0], strings.Join(subs, ", "))
	}
	return nil, nil, usagef("unknown %s command %q: the %s commands are %s", args[0], args[1], args[0], strings.Join(subs, ", "))
}

// subcommands returns the commands of group (dlq, topics), or none.
func subcommands(group string) []*command {
	var cs []*command
	for i := range commands {
		if strings.HasPrefix(commands[i].name, group+" ") {
			cs = append(cs, &commands[i])
		}
	}
	return cs
}

// topNames returns the first words of the commands, once each.
func topNames() []string {
	var names []string
	for _, c := range commands {
		first, _, _ := strings.Cut(c.name, " ")
		if len(names) == 0 || names[len(names)-1] != first {
			names = append(names, first)
		}
	}
	return names
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help"
}

// Main runs the command in args (without the program name) and returns the exit
// code. Logs go to stderr; stdout carries only what the command prints (for run,
// the stdout producer's messages). ctx ends the command: the binary cancels it on
// SIGINT or SIGTERM.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, env Env) int {
	if len(args) > 0 {
		switch {
		case args[0] == "version" || args[0] == "--version" || args[0] == "-version":
			fmt.Fprintln(stdout, "sweeper", version())
			return ExitOK
		case args[0] == "help" || isHelp(args[0]):
			return help(args[1:], stdout, stderr)
		}
	}
	c, rest, err := lookup(args)
	if err != nil {
		// "sweeper dlq --help" asks for the group's commands.
		if len(args) > 1 && isHelp(args[1]) && len(subcommands(args[0])) > 0 {
			printGroup(stdout, args[0])
			return ExitOK
		}
		hint := "sweeper help"
		if len(subcommands(args[0])) > 0 {
			hint = "sweeper " + args[0] + " --help"
		}
		fmt.Fprintf(stderr, "sweeper: %v\nRun `%s` for the commands.\n", err, hint)
		return ExitUsage
	}
	f, run, err := c.parse(rest, env)
	if err == nil {
		err = run(ctx, stdout, stderr)
	}
	var ue *usageError
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, flag.ErrHelp):
		printCommand(stdout, c, f)
		return ExitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "sweeper %s: %v\nRun `sweeper %s --help` for its flags.\n", c.name, err, c.name)
		return ExitUsage
	default:
		fmt.Fprintf(stderr, "sweeper %s: %v\n", c.name, err)
		return ExitFailure
	}
}

// help prints the overview, a group's commands, or one command's flags.
func help(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printOverview(stdout)
		return ExitOK
	}
	c, _, err := lookup(args)
	if err != nil {
		if len(subcommands(args[0])) > 0 && len(args) == 1 {
			printGroup(stdout, args[0])
			return ExitOK
		}
		fmt.Fprintf(stderr, "sweeper help: %v\n", err)
		return ExitUsage
	}
	f, _, _ := c.parse([]string{"--help"}, func(string) (string, bool) { return "", false })
	printCommand(stdout, c, f)
	return ExitOK
}

func printOverview(w io.Writer) {
	fmt.Fprint(w, "sweeper relays messages from a transactional outbox table in Postgres to a broker.\n\nUsage:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  sweeper %-15s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  sweeper %-15s %s\n", "version", "print the version (also --version)")
	fmt.Fprintf(w, "  sweeper %-15s %s\n", "help [COMMAND]", "print this, or a command's flags")
	fmt.Fprint(w, `
Run `+"`sweeper COMMAND --help`"+` for a command's flags, each with its environment
variable and default. Every flag can be set by its variable (OUTBOX_ and the
flag's name in capitals: --page-size is OUTBOX_PAGE_SIZE); the command line wins.
A bad flag, variable or value exits with status 2, a failure with status 1.
`)
}

func printGroup(w io.Writer, group string) {
	fmt.Fprintf(w, "Usage: sweeper %s COMMAND [flags]\n\n", group)
	for _, c := range subcommands(group) {
		fmt.Fprintf(w, "  sweeper %-15s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun `sweeper %s COMMAND --help` for a command's flags.\n", group)
}

func printCommand(w io.Writer, c *command, f *flags) {
	synopsis := c.name
	if len(f.operands) > 0 {
		synopsis += " " + strings.Join(f.operands, " ")
	}
	fmt.Fprintf(w, "Usage: sweeper %s [flags]\n\n%s.\n\nFlags (the command line wins over the variable):\n", synopsis, upperFirst(c.summary))
	f.usage(w)
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

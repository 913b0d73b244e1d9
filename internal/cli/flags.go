package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-sweeper/sweeper/outbox"
)

// envPrefix starts the environment variable of every flag: --page-size is
// OUTBOX_PAGE_SIZE.
const envPrefix = "OUTBOX_"

// envName returns the environment variable that sets flag name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// usageError is a bad command line or environment: the process exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// flags is a command's flag set, bound to OUTBOX_ environment variables.
type flags struct {
	fs   *flag.FlagSet
	help []flagHelp
	// phase is what parse is reading ("env" or "args"); source records, per flag,
	// the phase that set it last, so errors can name the variable or the flag.
	phase  string
	source map[string]string
	// noEnv names flags that take no variable: a command's selectors, such as
	// dlq purge --all, must never come from an environment left set.
	noEnv map[string]bool
	// operands names the arguments the command takes besides flags, such as
	// TOPIC; parse fills args with them, in order.
	operands []string
	args     []string
	// lookupEnv is the environment parse read.
	lookupEnv func(string) (string, bool)
}

type flagHelp struct{ name, value, def, usage string }

func newFlags(cmd string) *flags {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are printed once, by Main
	return &flags{fs: fs, source: make(map[string]string), noEnv: make(map[string]bool)}
}

func (f *flags) add(v flag.Value, name, placeholder, usage string) {
	f.fs.Var(tracked{v, f, name}, name, usage)
	f.help = append(f.help, flagHelp{name: name, value: placeholder, def: v.String(), usage: usage})
}

func (f *flags) String(p *string, name, def, placeholder, usage string) {
	*p = def
	f.add((*stringValue)(p), name, placeholder, usage)
}

func (f *flags) Int(p *int, name string, def int, usage string) {
	*p = def
	f.add((*intValue)(p), name, "n", usage)
}

func (f *flags) Duration(p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	f.add((*durationValue)(p), name, "duration", usage)
}

// bool registers a switch: present (or "true") sets it.
func (f *flags) bool(p *bool, name, usage string) { f.Bool(p, name, false, usage) }

// Bool registers a switch with a default; --name=false turns off one that is on.
func (f *flags) Bool(p *bool, name string, def bool, usage string) {
	*p = def
	f.fs.Var(tracked{(*boolValue)(p), f, name}, name, usage)
	f.help = append(f.help, flagHelp{name: name, value: "", def: strconv.FormatBool(def), usage: usage})
}

// Enum registers a string flag that takes one of choices.
func (f *flags) Enum(p *string, name, def string, choices []string, usage string) {
	*p = def
	f.add(&enumValue{p: p, choices: choices}, name, strings.Join(choices, "|"), usage)
}

// parse sets flags from the environment first and from args second, so the
// command line wins. It returns a usageError naming the flag or variable and the
// bad value, or flag.ErrHelp.
func (f *flags) parse(args []string, lookupEnv func(string) (string, bool)) error {
	var envErr error
	f.lookupEnv = lookupEnv
	f.phase = "env"
	f.fs.VisitAll(func(fl *flag.Flag) {
		if envErr != nil || f.noEnv[fl.Name] {
			return
		}
		v, ok := lookupEnv(envName(fl.Name))
		if !ok {
			return
		}
		if err := f.fs.Set(fl.Name, v); err != nil {
			envErr = usagef("invalid value %q for %s (--%s): %v", v, envName(fl.Name), fl.Name, err)
		}
	})
	if envErr != nil {
		return envErr
	}
	f.phase = "args"
	// Operands may stand before, between or after the flags, as people type
	// them (topics trip orders --reason x, or topics trip --reason x orders);
	// after "--" everything is an operand, for a topic that starts with "-".
	f.args = nil
	for rest := args; ; {
		if err := f.fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			// The flag package says "-name"; the docs say "--name".
			return usagef("%s", strings.Replace(err.Error(), " -", " --", 1))
		}
		left := f.fs.Args()
		if len(left) == 0 {
			break
		}
		if n := len(rest) - len(left); n > 0 && rest[n-1] == "--" {
			f.args = append(f.args, left...)
			break
		}
		f.args, rest = append(f.args, left[0]), left[1:]
	}
	switch {
	case len(f.args) > len(f.operands) && len(f.operands) == 0:
		return usagef("unexpected argument %q: sweeper %s takes flags only", f.args[0], f.fs.Name())
	case len(f.args) > len(f.operands):
		return usagef("unexpected argument %q: sweeper %s takes %s and flags", f.args[len(f.operands)], f.fs.Name(), strings.Join(f.operands, " "))
	case len(f.args) < len(f.operands):
		missing := f.operands[len(f.args)]
		return usagef("%s needs the %s: sweeper %s %s [flags]", f.fs.Name(), strings.ToLower(missing), f.fs.Name(), strings.Join(f.operands, " "))
	}
	return nil
}

// set reports whether flag name was given on the command line or through its
// environment variable.
func (f *flags) set(name string) bool {
	found := false
	f.fs.Visit(func(fl *flag.Flag) { found = found || fl.Name == name })
	return found
}

// overrides reports whether flag a, given on the command line, overrides
// flag b, given by a variable: the command line wins, over the other flag of
// a pair that excludes each other too (OUTBOX_ADMIN_TOKEN in the environment
// and --admin-token-file typed, say).
func (f *flags) overrides(a, b string) bool {
	return f.source[a] == "args" && f.source[b] == "env"
}

// origin names where flag name's value came from: its variable (and flag), or
// the flag.
func (f *flags) origin(name string) string {
	if f.source[name] == "env" {
		return envName(name) + " (--" + name + ")"
	}
	return "--" + name
}

// originOrBoth names a flag together with its variable, for messages about a
// value that is missing altogether.
func (f *flags) originOrBoth(name string) string {
	return "--" + name + " (" + envName(name) + ")"
}

// configError turns a library's *outbox.ConfigError into a usage error that
// names the variable when the value came from the environment.
func (f *flags) configError(err error) error {
	var ce *outbox.ConfigError
	if errors.As(err, &ce) && f.source[ce.Flag] == "env" {
		return usagef("%s: %v", envName(ce.Flag), err)
	}
	return &usageError{msg: err.Error()}
}

// tracked records which phase of parse set a flag.
type tracked struct {
	flag.Value
	f    *flags
	name string
}

// IsBoolFlag passes on the wrapped value's: the flag package lets a switch
// stand without a value only if it says so.
func (t tracked) IsBoolFlag() bool {
	b, ok := t.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func (t tracked) Set(v string) error {
	if err := t.Value.Set(v); err != nil {
		return err
	}
	t.f.source[t.name] = t.f.phase
	return nil
}

// usage writes the flags' help, each with its variable and default.
func (f *flags) usage(w io.Writer) {
	for _, h := range f.help {
		fmt.Fprintf(w, "  --%s %s\n", h.name, h.value)
		fmt.Fprintf(w, "        %s\n", h.usage)
		def := h.def
		if def == "" {
			def = `""`
		}
		if f.noEnv[h.name] {
			fmt.Fprintf(w, "        no variable, default %s\n", def)
			continue
		}
		fmt.Fprintf(w, "        env %s, default %s\n", envName(h.name), def)
	}
}

type stringValue string

func (s *stringValue) Set(v string) error { *s = stringValue(v); return nil }
func (s *stringValue) String() string     { return string(*s) }

type intValue int

func (i *intValue) Set(v string) error {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return errors.New("not a whole number")
	}
	*i = intValue(n)
	return nil
}
func (i *intValue) String() string { return strconv.Itoa(int(*i)) }

type durationValue time.Duration

func (d *durationValue) Set(v string) error {
	x, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		return errors.New("not a duration: write a number with a unit, such as 500ms, 1s or 5m")
	}
	*d = durationValue(x)
	return nil
}
func (d *durationValue) String() string { return time.Duration(*d).String() }

// TopicDurations registers a per-topic duration list, "orders=1h,codes=5m";
// a duration may be "never" (stored as -1).
func (f *flags) TopicDurations(p *map[string]time.Duration, name, usage string) {
	*p = nil
	f.add((*topicDurationsValue)(p), name, "topic=duration,…", usage)
}

type topicDurationsValue map[string]time.Duration

// Set reads "topic=duration" pairs separated by commas. A topic is cut at its
// last "=", so it may hold one (a duration never does); it cannot hold a
// comma. Spaces around a topic and a duration are dropped ("codes = 5m" is
// codes, as an operator who writes it means), so a topic that starts or ends
// with a space cannot be given here.
func (v *topicDurationsValue) Set(s string) error {
	m := map[string]time.Duration{}
	for pair := range strings.SplitSeq(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		i := strings.LastIndexByte(pair, '=')
		topic, d := "", ""
		if i >= 0 {
			topic, d = strings.TrimSpace(pair[:i]), strings.TrimSpace(pair[i+1:])
		}
		if topic == "" {
			return fmt.Errorf("%q is not topic=duration: write pairs such as orders=1h,codes=5m (a duration may be never)", pair)
		}
		if _, dup := m[topic]; dup {
			return fmt.Errorf("topic %q is given twice: give each topic one duration", topic)
		}
		if d == "never" {
			m[topic] = -1
			continue
		}
		x, err := time.ParseDuration(d)
		if err != nil || x <= 0 {
			return fmt.Errorf("%q for topic %q is not a positive duration: write a number with a unit, such as 90s, 1h or 24h, or never", d, topic)
		}
		if x < time.Millisecond {
			return fmt.Errorf("%q for topic %q is shorter than 1ms, the least max age: write at least 1ms, or never to exempt the topic from --max-age", d, topic)
		}
		m[topic] = x
	}
	*v = m
	return nil
}

func (v *topicDurationsValue) String() string {
	if v == nil || len(*v) == 0 {
		return ""
	}
	parts := make([]string, 0, len(*v))
	for _, t := range slices.Sorted(maps.Keys(*v)) {
		d := (*v)[t]
		if d < 0 {
			parts = append(parts, t+"=never")
		} else {
			parts = append(parts, t+"="+d.String())
		}
	}
	return strings.Join(parts, ",")
}

type enumValue struct {
	p       *string
	choices []string
}

func (e *enumValue) Set(v string) error {
	for _, c := range e.choices {
		if v == c {
			*e.p = v
			return nil
		}
	}
	return fmt.Errorf("choose one of %s", strings.Join(e.choices, ", "))
}

func (e *enumValue) String() string {
	if e.p == nil {
		return ""
	}
	return *e.p
}

type boolValue bool

func (b *boolValue) Set(v string) error {
	x, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		return errors.New("not true or false")
	}
	*b = boolValue(x)
	return nil
}
func (b *boolValue) String() string   { return strconv.FormatBool(bool(*b)) }
func (b *boolValue) IsBoolFlag() bool { return true }

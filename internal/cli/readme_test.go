package cli

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// readme returns the README's text.
func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	return string(b)
}

// Every sweeper command line the README shows, in its sh blocks and in its
// inline code, parses: the command exists, its flags exist and take the
// values shown, and it has the operands it needs. Placeholders (…, <topic>,
// $TOKEN) stand for a value.
func TestREADMECommandLinesParse(t *testing.T) {
	t.Parallel()
	text := readme(t)
	var lines []string
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(text, -1) {
		lines = append(lines, strings.Split(block[1], "\n")...)
	}
	for _, span := range regexp.MustCompile("`(sweeper [^`|]*)`").FindAllStringSubmatch(text, -1) {
		lines = append(lines, span[1])
	}
	checked := 0
	for _, line := range lines {
		words := shellWords(line)
		for i, w := range words {
			if w == ">" || w == ">>" || w == "|" { // the shell's, not the command's
				words = words[:i]
				break
			}
		}
		if len(words) == 0 || words[0] != "sweeper" {
			continue
		}
		args := words[1:]
		for i, a := range args {
			if a == "…" || strings.HasPrefix(a, "$") || (strings.HasPrefix(a, "<") && strings.HasSuffix(a, ">")) {
				args[i] = "x"
			}
		}
		if len(args) == 1 && len(subcommands(args[0])) > 0 {
			continue // a group named in prose, such as `sweeper dlq`
		}
		checked++
		if len(args) > 0 && (args[0] == "help" || args[0] == "version" || isHelp(args[len(args)-1])) {
			continue // Main answers these before any command
		}
		c, rest, err := lookup(args)
		require.NoError(t, err, "README: %s", line)
		_, _, err = c.parse(rest, noEnv)
		require.NoError(t, err, "README: %s", line)
	}
	require.Greater(t, checked, 15, "the README's command lines were not found")
}

// Every --flag the README mentions is a flag of some command (or of another
// tool the README shows), so a renamed or removed flag fails here.
func TestEveryFlagTheREADMEMentionsExists(t *testing.T) {
	t.Parallel()
	known := map[string]bool{"help": true, "version": true}
	for _, c := range commands {
		f, _, _ := c.parse([]string{"--help"}, noEnv)
		for _, h := range f.help {
			known[h.name] = true
		}
	}
	// Other tools' flags the README shows in its commands.
	for _, other := range []string{"skip-systemctl-redirect", "build-arg", "tags", "always", "cpu"} {
		known[other] = true
	}
	var unknown []string
	for _, m := range regexp.MustCompile(`(?:^|[\s(\x60'"])--([a-z][a-z0-9-]*[a-z0-9])`).FindAllStringSubmatch(readme(t), -1) {
		if !known[m[1]] && !slices.Contains(unknown, m[1]) {
			unknown = append(unknown, m[1])
		}
	}
	require.Empty(t, unknown, "the README mentions flags no command has")
}

// The README's flag table lists every flag of run with its variable and
// default, as --help does.
func TestTheREADMEFlagTableMatchesRun(t *testing.T) {
	t.Parallel()
	rows := map[string][]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)` \\| `([A-Z0-9_]+)` \\| ([^|]+) \\|").FindAllStringSubmatch(readme(t), -1) {
		rows[m[1]] = []string{m[2], strings.Trim(strings.TrimSpace(m[3]), "`")}
	}
	var o runOptions
	for _, h := range o.flags().help {
		row, ok := rows[h.name]
		if !assertTrue(t, ok, "the README's flag table has no row for --%s", h.name) {
			continue
		}
		require.Equal(t, envName(h.name), row[0], "--%s", h.name)
		require.True(t, sameDefault(row[1], h.def), "--%s: the README says the default is %q, the flag says %q", h.name, row[1], h.def)
		delete(rows, h.name)
	}
	require.Empty(t, rows, "the README's flag table has rows for flags run does not have")
}

func assertTrue(t *testing.T, ok bool, format string, args ...any) bool {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
	return ok
}

// sameDefault compares a default as the README writes it (none, 7d as 168h,
// 0 for a duration) with the flag's.
func sameDefault(readme, def string) bool {
	if readme == "none" {
		return def == "" || def == "none" // a flag whose value none is a choice
	}
	if readme == def {
		return true
	}
	a, errA := time.ParseDuration(readme)
	if readme == "0" {
		a, errA = 0, nil
	}
	b, errB := time.ParseDuration(def)
	return errA == nil && errB == nil && a == b
}

// shellWords splits a command line as sh would, well enough for the README:
// quotes, and a comment from " #".
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == '#' && !inWord:
			return words
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

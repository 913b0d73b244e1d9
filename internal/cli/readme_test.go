package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// docPages are the README and the pages of docs/ it links, as paths from the
// repository's root: the operator's documentation, which these tests hold to
// the commands and flags.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	adr, err := filepath.Glob("../../docs/adr/*.md")
	require.NoError(t, err)
	pages = append(append([]string{"../../README.md"}, pages...), adr...)
	for i, p := range pages {
		pages[i] = strings.TrimPrefix(p, "../../")
	}
	require.Greater(t, len(pages), 8, "the docs pages were not found")
	return pages
}

// readDoc returns the text of a page of docPages.
func readDoc(t *testing.T, page string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../..", page))
	require.NoError(t, err)
	return string(b)
}

// docs returns the text of every page of docPages, one after another.
func docs(t *testing.T) string {
	t.Helper()
	var all strings.Builder
	for _, p := range docPages(t) {
		all.WriteString(readDoc(t, p))
		all.WriteString("\n")
	}
	return all.String()
}

// Every sweeper command line the README and docs/ show, in their sh blocks
// and in their inline code, parses: the command exists, its flags exist and
// take the values shown, and it has the operands it needs. Placeholders (…,
// <topic>, $TOKEN) stand for a value.
func TestEveryCommandLineTheDocsShowParses(t *testing.T) {
	t.Parallel()
	text := docs(t)
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
		require.NoError(t, err, "docs: %s", line)
		_, _, err = c.parse(rest, noEnv)
		require.NoError(t, err, "docs: %s", line)
	}
	require.Greater(t, checked, 15, "the docs' command lines were not found")
}

// Every --flag the README and docs/ mention is a flag of some command (or of
// another tool they show), so a renamed or removed flag fails here.
func TestEveryFlagTheDocsMentionExists(t *testing.T) {
	t.Parallel()
	known := map[string]bool{"help": true, "version": true}
	for _, c := range commands {
		f, _, _ := c.parse([]string{"--help"}, noEnv)
		for _, h := range f.help {
			known[h.name] = true
		}
	}
	// Other tools' flags the docs show in their commands.
	for _, other := range []string{"skip-systemctl-redirect", "build-arg", "tags", "always", "cpu"} {
		known[other] = true
	}
	var unknown []string
	for _, m := range regexp.MustCompile(`(?:^|[\s(\x60'"])--([a-z][a-z0-9-]*[a-z0-9])`).FindAllStringSubmatch(docs(t), -1) {
		if !known[m[1]] && !slices.Contains(unknown, m[1]) {
			unknown = append(unknown, m[1])
		}
	}
	require.Empty(t, unknown, "the docs mention flags no command has")
}

// The configuration reference's flag table lists every flag of run with its
// variable and default, as --help does.
func TestTheConfigurationFlagTableMatchesRun(t *testing.T) {
	t.Parallel()
	rows := map[string][]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)` \\| `([A-Z0-9_]+)` \\| ([^|]+) \\|").FindAllStringSubmatch(readDoc(t, "docs/configuration.md"), -1) {
		rows[m[1]] = []string{m[2], strings.Trim(strings.TrimSpace(m[3]), "`")}
	}
	var o runOptions
	for _, h := range o.flags().help {
		row, ok := rows[h.name]
		if !assertTrue(t, ok, "docs/configuration.md's flag table has no row for --%s", h.name) {
			continue
		}
		require.Equal(t, envName(h.name), row[0], "--%s", h.name)
		require.True(t, sameDefault(row[1], h.def), "--%s: docs/configuration.md says the default is %q, the flag says %q", h.name, row[1], h.def)
		delete(rows, h.name)
	}
	require.Empty(t, rows, "docs/configuration.md's flag table has rows for flags run does not have")
}

func assertTrue(t *testing.T, ok bool, format string, args ...any) bool {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
	return ok
}

// sameDefault compares a default as the docs write it (none, 7d as 168h,
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

// shellWords splits a command line as sh would, well enough for the docs:
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

// Every relative link of the README and docs/ names a file that exists and,
// with a #fragment, a heading of that file, so a page or a section moved
// without its links fails here.
func TestEveryLinkOfTheDocsResolves(t *testing.T) {
	t.Parallel()
	checked := 0
	for _, page := range docPages(t) {
		text := readDoc(t, page)
		for _, m := range regexp.MustCompile(`\]\(([^)\s]+)\)`).FindAllStringSubmatch(withoutCode(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.ToSlash(filepath.Join(filepath.Dir(page), file))
			}
			checked++
			body, err := os.ReadFile(filepath.Join("../..", path))
			if !assertTrue(t, err == nil, "%s: link %s: no file %s", page, target, path) || anchor == "" {
				continue
			}
			require.Contains(t, headingAnchors(string(body)), anchor, "%s: link %s: no such heading in %s", page, target, path)
		}
	}
	require.Greater(t, checked, 30, "the docs' links were not found")
}

// The README's map links every page of docs/.
func TestTheREADMELinksEveryPage(t *testing.T) {
	t.Parallel()
	readme := readDoc(t, "README.md")
	for _, page := range docPages(t)[1:] {
		require.Contains(t, readme, "]("+page, "the README's map does not link %s", page)
	}
}

// headingAnchors are the anchors GitHub gives the headings of a Markdown text.
func headingAnchors(text string) []string {
	var anchors []string
	for _, m := range regexp.MustCompile(`(?m)^#{1,6} (.+)$`).FindAllStringSubmatch(withoutCode(text), -1) {
		s := strings.ToLower(strings.TrimSpace(m[1]))
		s = regexp.MustCompile(`[^\p{L}\p{N} _-]`).ReplaceAllString(s, "")
		anchors = append(anchors, strings.ReplaceAll(s, " ", "-"))
	}
	return anchors
}

// withoutCode drops fenced code blocks, whose lines are neither headings nor
// links.
func withoutCode(text string) string {
	return regexp.MustCompile("(?ms)^```.*?^```").ReplaceAllString(text, "")
}

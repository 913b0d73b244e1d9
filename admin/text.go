package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Hints that end the error of a topic or filter that checkText refuses: what
// the caller can do instead.
const (
	// A topic that is not UTF-8 exists only in a SQL_ASCII database (a UTF8 one
	// refuses it); its breaker still trips and recovers by itself.
	topicHint = "a topic that is not UTF-8 (rows of a SQL_ASCII database) cannot be tripped or reset by hand; " +
		"its breaker trips and recovers by itself"
	// Dead letters can always be selected by id, whatever their topic holds.
	filterHint = "select the dead letters of a topic that is not UTF-8 by id instead"
)

// checkText refuses a topic or filter that must not reach the breaker, the
// metrics or Postgres: bytes that are not UTF-8, and NUL. A UTF8 database
// refuses both in a text parameter, which made GET /dlq answer 500, and a topic
// tripped by that name made every later sweep fail, since the tripped topics
// are a parameter of the sweep's query. name is how the caller spelled the
// value (a path segment, a query parameter or a body field); hint, when set,
// says what to do instead.
func checkText(name, v, hint string) error {
	var problem string
	switch {
	case !utf8.ValidString(v):
		problem = "is not valid UTF-8: the API takes topics and filters as UTF-8 text, as the outbox's text columns hold them; " +
			"send the text's UTF-8 bytes (percent-encoded in a URL: café is caf%C3%A9)"
	case strings.IndexByte(v, 0) >= 0:
		problem = "holds a NUL byte, which no Postgres text value can hold, so no row has it: leave the NUL out"
	default:
		return nil
	}
	if hint != "" {
		problem += "; " + hint
	}
	return fmt.Errorf("%s %s %s", name, quoteShort(v), problem)
}

// quoteShort quotes v for an error message, and only its first 128 bytes when
// it is longer: a 1 MB topic must not become a 4 MB answer and log line.
func quoteShort(v string) string {
	const limit = 128
	if len(v) <= limit {
		return strconv.Quote(v)
	}
	return fmt.Sprintf("%q… (%d bytes)", v[:limit], len(v))
}

// readBody reads a request body, refusing one that is not UTF-8 with an error
// that names the field and its value. encoding/json would replace such bytes
// with U+FFFD without a word, so a topic filter would silently select other
// rows than the caller named, or none.
func readBody(r *http.Request) ([]byte, error) {
	raw, err := io.ReadAll(r.Body)
	if maxErr, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return nil, fmt.Errorf("body is larger than %d bytes: select fewer ids, or use a filter", maxErr.Limit)
	}
	if err != nil {
		return nil, fmt.Errorf("read the body: %v", err)
	}
	if utf8.Valid(raw) {
		return raw, nil
	}
	// Find the field, to name it; the raw values keep the bytes as sent.
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) == nil {
		for _, name := range slices.Sorted(maps.Keys(fields)) {
			v := fields[name]
			if utf8.Valid(v) {
				continue
			}
			if len(v) >= 2 && v[0] == '"' {
				v = v[1 : len(v)-1] // the string as written, escapes and all
			}
			return nil, checkText("body field "+name, string(v), "")
		}
	}
	i := invalidAt(raw)
	return nil, fmt.Errorf("body is not valid UTF-8 at byte %d (%q): send JSON in UTF-8", i, raw[i:min(len(raw), i+16)])
}

// invalidAt returns the offset of the first byte of b that is not UTF-8.
func invalidAt(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return len(b)
}

// cut returns v, or its first 128 bytes when it is longer, for a log line,
// which quotes by itself.
func cut(v string) string {
	if len(v) <= 128 {
		return v
	}
	return v[:128] + "…"
}

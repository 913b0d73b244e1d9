package writer

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// What an application writes goes through toColumns first: nothing it holds
// may panic there, and what it accepts the server and the sweeper take: text
// in UTF-8 without NUL, headers a JSON object without \u0000 that Go's
// decoder reads back with every key, a deadline Postgres can hold.
func FuzzToColumns(f *testing.F) {
	for _, s := range [][4]string{
		{"orders", "application/json", "tenant", "acme"},
		{"a\xff", "", "k", "v"},
		{"t", "x\x00", "", ""},
		{"t", "", "\xff", "one"},
		{"t", "", "k", "a\xffb"},
		{"t", "", "k", "\ufffd"},
		{"", "", "", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], int64(0))
	}
	f.Fuzz(func(t *testing.T, topic, contentType, key, value string, expires int64) {
		m := Message{Topic: topic, ContentType: contentType, Payload: []byte(value)}
		if key != "" {
			m.Headers = map[string]any{key: value, "nested": []any{value, map[string]any{key: 1}}}
		}
		if expires != 0 {
			m.ExpiresAt = time.Unix(expires, 0)
		}
		c, err := toColumns(&m)
		if err != nil {
			return
		}
		for _, s := range []string{c.topic, deref(c.contentType)} {
			if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
				t.Fatalf("accepted text %q", s)
			}
		}
		if !json.Valid(c.headers) || hasNUL(c.headers) {
			t.Fatalf("accepted headers %s", c.headers)
		}
		var back map[string]any
		if err := json.Unmarshal(c.headers, &back); err != nil {
			t.Fatalf("headers %s do not read back: %v", c.headers, err)
		}
		if key != "" {
			if _, ok := back[key]; !ok {
				t.Fatalf("header %q lost in %s", key, c.headers)
			}
		}
		if c.expiresAt != nil {
			if y := c.expiresAt.Year(); y < minYear || y > maxYear {
				t.Fatalf("accepted a deadline in year %d", y)
			}
		}
	})
}

package metrics

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"
)

// MaxLabelBytes bounds every label value the metrics export. It keeps every
// RabbitMQ routing key (at most 255 bytes) whole, yet a 10,000-byte topic costs
// the registry, each scrape and Prometheus no more than this per series.
const MaxLabelBytes = 256

// labelHashBytes is how many bytes of a long value's SHA-256 name it: 8 bytes
// (16 hex digits) keep two long topics with the same beginning apart with a
// chance of collision of about 2^-64 per pair.
const labelHashBytes = 8

// label makes s safe as a label value, and every label site goes through it.
// client_golang panics on a value that is not valid UTF-8 (WithLabelValues
// calls panic, not return an error), and topics come from rows, Redis and
// requests, none of which promise UTF-8: a SQL_ASCII database stores any bytes.
//
// Valid UTF-8 of at most MaxLabelBytes is returned as is, which is every topic
// in practice, so the fast path costs one scan and no allocation.
//
// Invalid bytes become \xHH escapes, as strconv.Quote writes them, and the
// valid text around them stays as it is. Replacing them with U+FFFD
// (strings.ToValidUTF8) was the other choice: it would merge "a\xff" and
// "a\xfe" into one series and lose what the row holds, where the escape keeps
// them apart and shows the operator the bytes to look for in the database. The
// escape does not escape backslashes, so that valid topics are never changed;
// a valid topic spelled with a literal `\xff` therefore shares its series with
// the byte 0xff, a collision we accept for readable labels.
//
// A value longer than MaxLabelBytes after escaping keeps its beginning, cut at
// a character (never inside an escape), then "…" and a hash of the whole
// original value, so that two long topics that begin alike stay two series.
func label(s string) string {
	if len(s) <= MaxLabelBytes && utf8.ValidString(s) {
		return s
	}
	const marker = "…"
	suffixLen := len(marker) + 2*labelHashBytes
	// Escape piece by piece, remembering the longest prefix that leaves room
	// for the suffix, so that a cut never splits a character or an escape.
	var b strings.Builder
	b.Grow(min(len(s), 2*MaxLabelBytes))
	cut := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			const hexDigits = "0123456789abcdef"
			b.WriteString(`\x`)
			b.WriteByte(hexDigits[s[i]>>4])
			b.WriteByte(hexDigits[s[i]&0xf])
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
		if b.Len() <= MaxLabelBytes-suffixLen {
			cut = b.Len()
		}
		if b.Len() > MaxLabelBytes {
			break // too long already: it will be cut at cut
		}
	}
	if b.Len() <= MaxLabelBytes {
		return b.String()
	}
	sum := sha256.Sum256([]byte(s))
	return b.String()[:cut] + marker + hex.EncodeToString(sum[:labelHashBytes])
}

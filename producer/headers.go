package producer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// EachHeader calls fn for each header of the row's headers column, in the
// column's order, with its name and its text: a string's contents, and any
// other value's JSON text as [HeaderText] gives it. A name given twice
// counts once, with its last value, as [Message.DecodeHeaders] has it.
// Headers that are not a JSON object give a message-class error naming the
// row; so does an error fn returns, as it is.
//
// It is DecodeHeaders for producers that send headers as bytes or text
// (Kafka, NATS): on the usual column (names and string values without
// escapes, numbers, true, false, null) it allocates once, for the names,
// where decoding into a map and encoding each value again cost a dozen
// allocations a header. text aliases the column: fn must copy what it keeps
// past the row's send, or not change it.
func (m *Message) EachHeader(fn func(name string, text []byte) error) error {
	h := m.Headers
	if len(h) == 0 || string(h) == "{}" {
		return nil
	}
	if !json.Valid(h) {
		_, err := m.DecodeHeaders() // its error says what is wrong, as before
		if err == nil {
			err = NewMessageError(ReasonInvalidMessage, []int64{m.ID}, fmt.Errorf("headers of row %d are not valid JSON", m.ID))
		}
		return err
	}
	i := skipSpace(h, 0)
	if h[i] != '{' {
		_, err := m.DecodeHeaders()
		return err
	}
	// The members, found first so that a name given twice keeps its last
	// value; a few headers fit the array, which stays on the stack.
	var buf [16]headerMember
	members := buf[:0]
	i = skipSpace(h, i+1)
	for h[i] != '}' {
		var mb headerMember
		end := stringEnd(h, i)
		mb.name = [2]int{i, end}
		i = skipSpace(h, skipSpace(h, end)+1) // past the colon
		end = valueEnd(h, i)
		mb.value = [2]int{i, end}
		members = append(members, mb)
		i = skipSpace(h, end)
		if h[i] == ',' {
			i = skipSpace(h, i+1)
		}
	}
	names := string(h) // one allocation for every plain name
	for k, mb := range members {
		name, err := headerName(names, h, mb.name)
		if err != nil {
			return NewMessageError(ReasonInvalidMessage, []int64{m.ID}, fmt.Errorf("headers of row %d: %w", m.ID, err))
		}
		if laterName(names, h, members[k+1:], name) {
			continue
		}
		text, err := headerValue(h[mb.value[0]:mb.value[1]])
		if err != nil {
			return NewMessageError(ReasonInvalidMessage, []int64{m.ID}, fmt.Errorf("headers of row %d: header %s: %w", m.ID, Quote(name), err))
		}
		if err := fn(name, text); err != nil {
			return err
		}
	}
	return nil
}

// headerMember is where a member's name and value lie in the column.
type headerMember struct{ name, value [2]int }

// laterName reports whether one of later is named name.
func laterName(names string, h []byte, later []headerMember, name string) bool {
	for _, mb := range later {
		if n, err := headerName(names, h, mb.name); err == nil && n == name {
			return true
		}
	}
	return false
}

// headerName returns the JSON string at span of h: a substring of names
// (h as a string) when it has no escape, else the string decoded.
func headerName(names string, h []byte, span [2]int) (string, error) {
	raw := h[span[0]:span[1]]
	if plain(raw) {
		return names[span[0]+1 : span[1]-1], nil
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

// headerValue returns a header value's text: a string's contents (raw[1:-1]
// when it has no escape), a number's or a literal's JSON text, and an
// object's or array's JSON encoded again (keys sorted, as HeaderText does).
func headerValue(raw []byte) ([]byte, error) {
	switch raw[0] {
	case '"':
		if plain(raw) {
			return raw[1 : len(raw)-1], nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []byte(s), nil
	case '{', '[':
		var v any
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		s, err := HeaderText(v)
		return []byte(s), err
	}
	return raw, nil // a number, true, false or null: its text
}

// HeaderText returns a header value of [Message.DecodeHeaders] as text: a
// string as it is, anything else as its JSON encoding.
func HeaderText(v any) (string, error) {
	if s, ok := v.(string); ok {
		return s, nil
	}
	j, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return string(j), nil
}

// plain reports whether a JSON string is its contents in quotes: no escape,
// and valid UTF-8 (decoding replaces invalid bytes with U+FFFD).
func plain(raw []byte) bool {
	return bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw)
}

func skipSpace(h []byte, i int) int {
	for i < len(h) && (h[i] == ' ' || h[i] == '\t' || h[i] == '\n' || h[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index past the JSON string that starts at h[i],
// which must be valid JSON.
func stringEnd(h []byte, i int) int {
	for i++; h[i] != '"'; i++ {
		if h[i] == '\\' {
			i++
		}
	}
	return i + 1
}

// valueEnd returns the index past the JSON value that starts at h[i], in
// valid JSON.
func valueEnd(h []byte, i int) int {
	switch h[i] {
	case '"':
		return stringEnd(h, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch h[i] {
			case '"':
				i = stringEnd(h, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	}
	for ; i < len(h); i++ {
		switch h[i] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return i
		}
	}
	return i
}

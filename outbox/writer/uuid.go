package writer

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// The few UUID operations a writer needs, written here rather than imported
// so that the package depends on pgx alone: an application's build should
// not grow by a module for forty lines.

// newUUIDv7 returns a time-ordered UUID (RFC 9562, version 7): 48 bits of
// Unix milliseconds, then random bits.
func newUUIDv7() [16]byte {
	var u [16]byte
	rand.Read(u[6:]) // never fails (crypto/rand)
	ms := uint64(time.Now().UnixMilli())
	binary.BigEndian.PutUint16(u[0:2], uint16(ms>>32))
	binary.BigEndian.PutUint32(u[2:6], uint32(ms))
	u[6] = 0x70 | u[6]&0x0f // version 7
	u[8] = 0x80 | u[8]&0x3f // variant 10
	return u
}

// parseUUID reads a UUID in the forms applications write: canonical
// xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (any case), 32 hex digits, and either
// in braces or after urn:uuid:.
func parseUUID(s string) ([16]byte, error) {
	var u [16]byte
	t := s
	switch {
	case len(t) == 45 && strings.EqualFold(t[:9], "urn:uuid:"):
		t = t[9:]
	case len(t) == 38 && t[0] == '{' && t[37] == '}':
		t = t[1:37]
	}
	switch len(t) {
	case 36:
		if t[8] != '-' || t[13] != '-' || t[18] != '-' || t[23] != '-' {
			return u, fmt.Errorf("invalid UUID format")
		}
		t = t[:8] + t[9:13] + t[14:18] + t[19:23] + t[24:]
	case 32:
	default:
		return u, fmt.Errorf("invalid UUID length: %d", len(s))
	}
	if _, err := hex.Decode(u[:], []byte(t)); err != nil {
		return u, fmt.Errorf("invalid UUID format")
	}
	return u, nil
}

// uuidString writes u in canonical form.
func uuidString(u [16]byte) string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

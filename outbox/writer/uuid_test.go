package writer

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseUUIDTakesTheFormsApplicationsWrite(t *testing.T) {
	const canon = "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22"
	for _, s := range []string{canon, strings.ToUpper(canon), strings.ReplaceAll(canon, "-", ""),
		"{" + canon + "}", "urn:uuid:" + canon, "URN:UUID:" + canon} {
		u, err := parseUUID(s)
		require.NoError(t, err, s)
		require.Equal(t, canon, uuidString(u), s)
	}
	for _, s := range []string{"", "nope", canon[:35], canon + "0", strings.Replace(canon, "-", "x", 1),
		strings.Replace(canon, "6", "g", 1), "{" + canon, "urn:uuid:" + canon[:35] + "}"} {
		_, err := parseUUID(s)
		require.Error(t, err, s)
	}
}

func TestNewUUIDv7IsTimeOrderedAndVersioned(t *testing.T) {
	prev := ""
	for range 1000 {
		s := uuidString(newUUIDv7())
		require.Equal(t, byte('7'), s[14], s)
		require.Contains(t, "89ab", string(s[19]), s)
		// The first 48 bits are milliseconds: never behind the previous id's.
		require.GreaterOrEqual(t, s[:13], prev, s)
		prev = s[:13]
		back, err := parseUUID(s)
		require.NoError(t, err)
		require.Equal(t, s, uuidString(back))
	}
}

// Whatever an application puts in a message, encodeJSON refuses it with an
// error or encodes it so that the database reads back exactly what was given:
// JSON must not change a byte of a topic or a payload.
func FuzzEncodeJSON(f *testing.F) {
	f.Add("orders", []byte("body"), "", "", "", "")
	f.Add("a\xffb", []byte{0, 0xff}, "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22", "text/plain", "c\u2028", "k\"\\")
	f.Add("", []byte(nil), "nope", "", "", "")
	w, err := New(Table{})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, topic string, payload []byte, id, contentType, correlation, key string) {
		m := Message{Topic: topic, Payload: payload, MessageID: id, ContentType: contentType, CorrelationID: correlation,
			PartitionKey: key, Headers: map[string]any{"h": correlation}}
		doc, err := w.encodeJSON([]Message{m})
		if err != nil {
			return
		}
		got := decodeJSON(t, doc)
		require.Len(t, got, 1)
		require.Equal(t, topic, got[0].Topic)
		require.Equal(t, string(payload), string(got[0].Payload))
		require.Equal(t, contentType, deref(got[0].ContentType))
		require.Equal(t, correlation, deref(got[0].CorrelationID))
		require.Equal(t, key, deref(got[0].PartitionKey))
		if id != "" {
			u, err := parseUUID(id)
			require.NoError(t, err)
			require.Equal(t, uuidString(u), got[0].MessageID)
		}
	})
}

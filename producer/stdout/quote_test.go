package stdout

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzAppendJSONString holds the hand-quoting of plain strings to what
// encoding/json writes, byte for byte, whatever the string.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "orders", "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22", "a<b>&c", `q"b\s`, "\x7f", "\x1f", "\xff", "é", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		require.NoError(t, err)
		require.Equal(t, string(want), string(appendJSONString([]byte("x"), s)[1:]), "%q", s)
	})
}

package writer

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func decodeJSON(t *testing.T, doc string) []jsonMessage {
	var out []jsonMessage
	require.NoError(t, json.Unmarshal([]byte(doc), &out))
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

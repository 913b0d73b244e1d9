package admin

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Which Host headers name the API: the listening address's names, IP
// literals where it is not loopback, and the names given; never a name a
// web page could point at it (DNS rebinding). Ports are not compared.
func TestHostRule(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr    string
		allowed []string
		host    string
		ok      bool
	}{
		{"127.0.0.1:7488", nil, "127.0.0.1:7488", true},
		{"127.0.0.1:7488", nil, "localhost:7488", true},
		{"127.0.0.1:7488", nil, "LOCALHOST.:7488", true},
		{"127.0.0.1:7488", nil, "[::1]:7488", true},
		{"127.0.0.1:7488", nil, "127.0.0.1:9999", true}, // a port forward
		{"127.0.0.1:7488", nil, "127.0.0.1", true},
		{"127.0.0.1:7488", nil, "", true}, // HTTP/1.0: no browser
		{"127.0.0.1:7488", nil, "attacker.example:7488", false},
		{"127.0.0.1:7488", nil, "attacker.example", false},
		{"127.0.0.1:7488", nil, "127.0.0.1.nip.io:7488", false},
		{"127.0.0.1:7488", nil, "10.0.0.5:7488", false},
		{"127.0.0.1:7488", []string{"sweeper.internal"}, "Sweeper.Internal:443", true},
		{"127.0.0.1:7488", []string{"sweeper.internal"}, "other.internal", false},
		{"localhost:7488", nil, "127.0.0.1:7488", true},
		{"localhost:7488", nil, "evil.localhost.example", false},
		{"[::1]:7488", nil, "[::1]:7488", true},
		{"0.0.0.0:7488", nil, "10.1.2.3:7488", true}, // a kubelet's probe, a scrape by pod IP
		{"0.0.0.0:7488", nil, "[fd00::1]:7488", true},
		{"0.0.0.0:7488", nil, "localhost:7488", true},
		{"0.0.0.0:7488", nil, "attacker.example:7488", false},
		{"0.0.0.0:7488", nil, "sweeper:7488", false},
		{"0.0.0.0:7488", []string{"sweeper"}, "sweeper:7488", true},
		{":7488", nil, "attacker.example", false},
		{":7488", nil, "192.168.1.9", true},
		{"10.0.0.5:7488", nil, "10.0.0.5:7488", true},
		{"sweeper.example:7488", nil, "sweeper.example:7488", true},
		{"sweeper.example:7488", nil, "attacker.example:7488", false},
		{"", nil, "127.0.0.1:1234", true}, // Handler without an address: as every interface
		{"", nil, "example.com", false},
	} {
		got := newHostRule(tc.addr, tc.allowed).allows(tc.host)
		require.Equal(t, tc.ok, got, "listening on %q, allowed %v: Host %q", tc.addr, tc.allowed, tc.host)
	}
}

// A token that cannot work, or is a mistake, is refused with an error that
// says what is wrong and where, and never shows the token.
func TestCheckToken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ token, want string }{
		{"", ""},
		{"s3cret", ""},
		{"AbC-._~+/=!$%&*", ""},
		{"s3cret\n", `a newline (\n) at its end`},
		{"s3cret\r\n", `a carriage return (\r) at byte 7 of 8`},
		{" s3cret", "a space at its start"},
		{"s3cret ", "a space at its end"},
		{"s3 cret", "a space at byte 3 of 7"},
		{" ", "1 bytes of whitespace and nothing else"},
		{"\t\n", "2 bytes of whitespace and nothing else"},
		{"s3\x00cret", "a control character (0x00) at byte 3"},
		{"sécret", "a character that is not ASCII at byte 2"},
	} {
		err := CheckToken(tc.token)
		if tc.want == "" {
			require.NoError(t, err, "%q", tc.token)
			continue
		}
		require.ErrorContains(t, err, tc.want, "%q", tc.token)
		require.ErrorContains(t, err, "--admin-token-file")
		if strings.TrimSpace(tc.token) != "" {
			require.NotContains(t, err.Error(), strings.TrimSpace(tc.token), "the error shows no token")
		}
	}
	// A token of spaces no longer lets the API listen beyond loopback.
	require.ErrorContains(t, CheckAddr("0.0.0.0:7488", " "), "whitespace and nothing else")
	require.NoError(t, CheckAddr("0.0.0.0:7488", "s3cret"))
}

package cli

import (
	"net/netip"
	"os"
	"strings"

	"github.com/outbox-sweeper/sweeper/admin"
)

// adminToken resolves the admin token of a command from --admin-token or
// --admin-token-file (one of them), and refuses one admin.CheckToken refuses,
// naming where it came from. A file's trailing newline is dropped, as files
// of secrets (echo > file, a Kubernetes Secret written by hand) end in one;
// a value given directly is taken as given, so a newline or a space in it is
// an error to fix, not a guess: trimmed silently, the same variable would
// work here and fail in every other client of the API.
func adminToken(f *flags, token, file string) (string, error) {
	if file != "" && token != "" {
		switch {
		case f.overrides("admin-token", "admin-token-file"):
			file = ""
		case f.overrides("admin-token-file", "admin-token"):
			token = ""
		default:
			return "", usagef("%s and %s are both set: give the token one way", f.origin("admin-token"), f.origin("admin-token-file"))
		}
	}
	if file != "" {
		raw, err := os.ReadFile(file)
		if err != nil {
			return "", usagef("%s: cannot read the token: %v", f.origin("admin-token-file"), err)
		}
		token = strings.TrimRight(string(raw), "\r\n")
		if token == "" {
			return "", usagef("%s: %s is empty: write the token in it", f.origin("admin-token-file"), file)
		}
		if err := admin.CheckToken(token); err != nil {
			return "", usagef("%s: %s: %v", f.origin("admin-token-file"), file, err)
		}
		return token, nil
	}
	if err := admin.CheckToken(token); err != nil {
		return "", usagef("%s: %v", f.origin("admin-token"), err)
	}
	return token, nil
}

// allowedHosts reads --admin-allowed-hosts: host names separated by commas,
// without ports.
func allowedHosts(f *flags, v string) ([]string, error) {
	var out []string
	for h := range strings.SplitSeq(v, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		bare := strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
		_, ipErr := netip.ParseAddr(bare)
		if strings.ContainsAny(bare, "/@ \t") || (strings.Contains(bare, ":") && ipErr != nil) {
			return nil, usagef("invalid value %q for %s: %q is not a host name; give names such as sweeper.example.com, "+
				"separated by commas, without a scheme or a port (the port is never compared)", v, f.origin("admin-allowed-hosts"), h)
		}
		out = append(out, h)
	}
	return out, nil
}

// adminTokenFlags registers --admin-token and --admin-token-file; usage says
// what the token is for.
func adminTokenFlags(f *flags, token, file *string, usage string) {
	f.String(token, "admin-token", "", "token", usage)
	f.String(file, "admin-token-file", "", "path", "read --admin-token from this file (a mounted secret); its trailing newline is dropped")
}

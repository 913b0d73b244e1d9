package cli

import (
	"net/url"
	"strings"
)

// The helpers below keep secrets out of what the commands print: URL flags'
// passwords and tokens, whether the URL parses or not, and Service Bus keys,
// also where a library's error quotes them.

// redactURL hides a URL's password, for messages.
func redactURL(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return redactIn(u, u) // unparsable, and perhaps for a password with a stray character
	}
	if parsed.User == nil {
		return u
	}
	if _, ok := parsed.User.Password(); ok {
		parsed.User = url.UserPassword(parsed.User.Username(), "xxxxx")
	}
	return parsed.String()
}

// redactIn returns text with the user information of rawURL (what stands
// between "://" and the last "@": a password, a token) replaced by xxxxx, so
// that neither the URL nor an error quoting it prints the secret, whether or
// not the URL parses.
func redactIn(text, rawURL string) string {
	start := strings.Index(rawURL, "://")
	end := strings.LastIndex(rawURL, "@")
	if start < 0 || end <= start+3 {
		return text
	}
	secret := rawURL[start+3 : end]
	if i := strings.IndexByte(secret, ':'); i >= 0 {
		secret = secret[i+1:] // keep the user name
	}
	if secret == "" {
		return text
	}
	return strings.ReplaceAll(text, secret, "xxxxx")
}

// redactAccessKey returns text with the SharedAccessKey (and SharedAccessSignature)
// values of a Service Bus connection string replaced by xxxxx.
func redactAccessKey(text, connStr string) string {
	for _, part := range strings.Split(connStr, ";") {
		k, v, ok := strings.Cut(part, "=")
		k = strings.ToLower(strings.TrimSpace(k))
		if ok && v != "" && (k == "sharedaccesskey" || k == "sharedaccesssignature") {
			text = strings.ReplaceAll(text, v, "xxxxx")
		}
	}
	return text
}

package admin

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// What a web page of another site can make a browser send to this API, and
// why each is refused (docs/operations.md, "Admin HTTP API", "Browsers"):
//
//   - A POST with a "simple" content type (text/plain, a form), or with none,
//     which needs no consent from the server: fetch(…, {mode: "no-cors"}) or a
//     form. Every POST here changes something, so each must carry
//     Content-Type: application/json, which a page of another origin can
//     only send after a CORS preflight that this API never answers.
//   - The same POST from a browser that says where it comes from
//     (Sec-Fetch-Site, else Origin): refused unless it is the API's own
//     origin, whatever its content type (http.CrossOriginProtection).
//   - A read from a script of another site (Sec-Fetch-Site cross-site or
//     same-site, not a navigation): its answer is opaque to the page, but
//     the API would do the work, a large one at will.
//   - Any request, reads included, through a name the attacker controls and
//     points at this address (DNS rebinding): the browser then sends that
//     name as Host. Only the listening address's names, IP literals where the
//     address is not loopback, and the names given in AllowedHosts are served.

// hostRule says which Host headers name this API.
type hostRule struct {
	// bind is the listening address's host, lower case: "" for every
	// interface (or when the address is not known).
	bind string
	// loopback: bound to loopback only, where only loopback names can reach
	// it without a proxy (and a proxy's name goes in AllowedHosts).
	loopback bool
	names    map[string]bool
}

func newHostRule(addr string, allowed []string) hostRule {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	r := hostRule{bind: normalHost(host), names: map[string]bool{}}
	if ip, err := netip.ParseAddr(r.bind); err == nil && ip.IsUnspecified() {
		r.bind = ""
	}
	r.loopback = isLoopback(r.bind)
	for _, n := range allowed {
		r.names[normalHost(n)] = true
	}
	return r
}

// normalHost lower-cases a host and drops IPv6 brackets and a trailing dot.
func normalHost(h string) string {
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// allows reports whether a request's Host header (host, or host:port) names
// this API. The port is not compared: a port forward (kubectl port-forward,
// ssh -L) changes it, and a rebinding attack cannot choose another host by it.
func (r hostRule) allows(hostport string) bool {
	if hostport == "" {
		return true // HTTP/1.0 without Host: nothing a browser sends
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = normalHost(host)
	if r.names[host] || host == r.bind && host != "" {
		return true
	}
	if r.loopback {
		return isLoopback(host)
	}
	// A name no one but the operator chose must be listed; an IP literal
	// cannot be rebound. "localhost" always is this machine.
	_, err := netip.ParseAddr(host)
	return err == nil || host == "localhost"
}

// crossOrigin is the standard library's check of Sec-Fetch-Site and Origin;
// its errors are answered in JSON by guard.
var crossOrigin = http.NewCrossOriginProtection()

// refusal is why guard refuses a request, with its status; nil when it may
// go on.
type refusal struct {
	status int
	msg    string
}

// check applies the rules above: Host to every request, the rest to the
// POSTs of the routes the API serves (route tells).
func (a *api) check(r *http.Request, route bool) *refusal {
	if !a.hosts.allows(r.Host) {
		return &refusal{http.StatusForbidden, fmt.Sprintf("Host %s does not name this API (it listens on %s): "+
			"call it by its address, or add the name to --admin-allowed-hosts (OUTBOX_ADMIN_ALLOWED_HOSTS); "+
			"other names are refused so that a web page cannot reach the API through a name of its own (DNS rebinding)",
			quoteShort(r.Host), a.listening())}
	}
	if !route {
		return nil
	}
	if r.Method != http.MethodPost {
		// A read a page of another site makes a browser send (fetch with
		// mode no-cors) gets no answer it can read, but the API does the
		// work: /dlq with payloads, in a loop, exhausted memory (an
		// independent review, 2026-11-29). A browser says so in
		// Sec-Fetch-Site; a link followed to the console is a navigation,
		// and served.
		if site := r.Header.Get("Sec-Fetch-Site"); (site == "cross-site" || site == "same-site") && r.Header.Get("Sec-Fetch-Mode") != "navigate" {
			return &refusal{http.StatusForbidden, "cross-origin request refused: a web page of another site cannot read the sweeper's API " +
				"(Sec-Fetch-Site: " + site + "); use the console served here, the CLI or curl"}
		}
		return nil
	}
	if err := crossOrigin.Check(r); err != nil {
		return &refusal{http.StatusForbidden, "cross-origin request refused: a web page of another site cannot change the sweeper " +
			"(Sec-Fetch-Site or Origin names another origin than this API's); use the console served here, the CLI or curl"}
	}
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		return &refusal{http.StatusUnsupportedMediaType, fmt.Sprintf("POST needs Content-Type: application/json, even with an empty body "+
			"(got %s): a web page of another site cannot send that type without the API's consent, which it never gives; "+
			"with curl, add -H 'Content-Type: application/json'", quoteShort(ct))}
	}
	return nil
}

// listening names the address for the Host refusal.
func (a *api) listening() string {
	if a.cfg.Addr == "" {
		return "an address not given"
	}
	return a.cfg.Addr
}

// CheckToken refuses a bearer token that could not work or could be a
// mistake: whitespace around it (a file's or a variable's trailing newline,
// which made every call 401, and a token of spaces, which let the API listen
// beyond loopback), and any character but printable ASCII, which an HTTP
// header cannot carry as typed (Go's client refuses a newline, a browser's
// fetch anything beyond Latin-1). Its error never quotes the token.
func CheckToken(token string) error {
	if token == "" {
		return nil
	}
	const fix = "a bearer token is printable ASCII without spaces (e.g. `openssl rand -hex 32`); " +
		"a token kept in a file goes in --admin-token-file (OUTBOX_ADMIN_TOKEN_FILE), which drops the file's trailing newline"
	if strings.TrimSpace(token) == "" {
		return fmt.Errorf("the admin token is %d bytes of whitespace and nothing else: %s", len(token), fix)
	}
	for i := 0; i < len(token); i++ {
		c := token[i]
		if c > ' ' && c < 0x7f {
			continue
		}
		where := fmt.Sprintf("byte %d of %d", i+1, len(token))
		switch {
		case i == len(token)-1:
			where = "its end"
		case i == 0:
			where = "its start"
		}
		return fmt.Errorf("the admin token holds %s at %s: %s", describeByte(token, i), where, fix)
	}
	return nil
}

// describeByte names the character at token[i] without showing the token.
func describeByte(token string, i int) string {
	switch c := token[i]; {
	case c == '\n':
		return `a newline (\n)`
	case c == '\r':
		return `a carriage return (\r)`
	case c == '\t':
		return `a tab (\t)`
	case c == ' ':
		return "a space"
	case c < ' ' || c == 0x7f:
		return fmt.Sprintf("a control character (%#02x)", c)
	default:
		return "a character that is not ASCII"
	}
}

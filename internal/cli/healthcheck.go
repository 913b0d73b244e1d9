package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/outbox-sweeper/sweeper/admin"
)

// healthcheckOptions are the flags of `sweeper healthcheck`, which a container
// image without a shell or curl (distroless) runs as its HEALTHCHECK.
type healthcheckOptions struct {
	adminAddr string
	timeout   time.Duration
}

// healthcheckFlags takes run's --admin-addr and its variable, so that the
// check reads the same OUTBOX_ADMIN_ADDR as the sweeper it checks.
func healthcheckFlags(o *healthcheckOptions) *flags {
	f := newFlags("healthcheck")
	f.String(&o.adminAddr, "admin-addr", admin.AddrDefault, "host:port", "the admin address the sweeper listens on (its --admin-addr); a wildcard host (0.0.0.0, ::) is asked on loopback")
	f.Duration(&o.timeout, "timeout", 5*time.Second, "how long to wait for the answer")
	return f
}

func healthcheckCommand(ctx context.Context, o *healthcheckOptions, f *flags, out, _ io.Writer) error {
	if o.adminAddr == "" {
		return usagef("%s is empty: the admin API is off, so there is nothing to check; give the sweeper an --admin-addr", f.originOrBoth("admin-addr"))
	}
	host, port, err := net.SplitHostPort(o.adminAddr)
	if err != nil {
		return usagef("invalid value %q for %s: write host:port, e.g. %s", o.adminAddr, f.origin("admin-addr"), admin.AddrDefault)
	}
	if o.timeout <= 0 {
		return usagef("%s is %s: it must be more than 0", f.origin("timeout"), o.timeout)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	target := "http://" + net.JoinHostPort(host, port) + "/healthz"
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("unhealthy: %w (is the sweeper running with --admin-addr %s?)", err, o.adminAddr)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("unhealthy: %s answered %s", target, resp.Status)
	}
	fmt.Fprintf(out, "healthy: %s answered %s\n", target, resp.Status)
	return nil
}

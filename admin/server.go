package admin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// AddrDefault is where the sweeper's admin API listens unless told otherwise:
// loopback only, on a port applications rarely take. The sweeper usually runs
// beside an application (a sidecar, or a second process on its host), and
// 8080, 8000, 3000 and 5000 are the ports web frameworks default to, 9090 is
// Prometheus's and 9100-9999 are the exporters'; a taken port would stop the
// sweeper from starting.
const AddrDefault = "127.0.0.1:7488"

// Start listens on cfg.Addr, so that a taken port fails the start-up, and
// serves the API in the background until ctx is done. It refuses a
// non-loopback address without a token, with an error saying what to do. wait
// blocks until the server has stopped.
func Start(ctx context.Context, cfg Config) (wait func(), err error) {
	return serve(ctx, cfg, Handler(cfg))
}

// serve serves h on cfg.Addr until ctx is done.
func serve(ctx context.Context, cfg Config, h http.Handler) (wait func(), err error) {
	if err := CheckAddr(cfg.Addr, cfg.Token); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("admin API: listen on %s (--admin-addr): %w", cfg.Addr, err)
	}
	srv := &http.Server{
		// Requests end with the relay: a purge or a replay (not bounded by
		// the request timeout) would otherwise hold its connection, and
		// the pool's close at shutdown, until it ended.
		BaseContext:       func(net.Listener) context.Context { return ctx },
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && cfg.Logger != nil {
			cfg.Logger.Error("admin API stopped", "err", err)
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
		case <-done: // the server failed by itself
			return
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return func() { <-done }, nil
}

// CheckAddr refuses a token CheckToken refuses, and to serve without a token
// anywhere but on loopback.
func CheckAddr(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("admin address %q (--admin-addr): %w", addr, err)
	}
	if err := CheckToken(token); err != nil {
		return err
	}
	if token != "" {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("admin address %q (--admin-addr) is reachable from other hosts and no --admin-token (OUTBOX_ADMIN_TOKEN) is set: "+
		"set a token, or listen on 127.0.0.1", addr)
}

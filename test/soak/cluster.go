package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// cluster is a Postgres server of the harness's own, in a temporary directory,
// with initdb's defaults (autovacuum on, shared_buffers 128MB, fsync and
// synchronous_commit on), listening on 127.0.0.1 at a free port. The machine's
// shared server runs with autovacuum off, which hides the failure this harness
// is for.
type cluster struct {
	pgBin string
	dir   string // the temporary directory: data/, the socket and log
	port  int
	// runAs is the user that runs initdb and pg_ctl when the harness is root
	// (Postgres refuses to run as root); empty otherwise.
	runAs string
	// keepLog, when set, is where the server's log is copied when it stops
	// (with --pg-opts turning on auto_explain, say, to read plans afterwards).
	keepLog string
}

// startCluster initialises and starts a cluster. On an error it removes what
// it made.
//
// opts are more server settings, as postgres's own command line takes them
// (-c name=value ...): for diagnosis only, since every figure the harness
// reports is meant for initdb's defaults.
func startCluster(ctx context.Context, pgBin, opts, keepLog string) (_ *cluster, err error) {
	dir, err := os.MkdirTemp("", "soak-pg-")
	if err != nil {
		return nil, err
	}
	c := &cluster{pgBin: pgBin, dir: dir, keepLog: keepLog}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, the cluster needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
		c.runAs = "postgres"
	}
	if c.port, err = freePort(); err != nil {
		return nil, err
	}
	if out, err := c.command(ctx, "initdb", "-D", c.data(), "-A", "trust", "-U", "postgres", "-E", "UTF8",
		"--no-instructions").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	// Only where it listens is set: everything else is initdb's default.
	opts = strings.TrimSpace(fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 %s", c.port, c.dir, opts))
	if out, err := c.command(ctx, "pg_ctl", "-D", c.data(), "-l", c.logFile(), "-w", "-t", "120", "-o", opts,
		"start").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(c.logFile())
		return nil, fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	return c, nil
}

func (c *cluster) data() string    { return filepath.Join(c.dir, "data") }
func (c *cluster) logFile() string { return filepath.Join(c.dir, "postgres.log") }

// url is the URL of database db on the cluster.
func (c *cluster) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&application_name=soak", c.port, db)
}

// command runs a Postgres program, as the postgres user when the harness is
// root, in a process group of its own: a Ctrl-C at the terminal reaches the
// harness alone, which then stops the sweeper before the server.
func (c *cluster) command(ctx context.Context, prog string, args ...string) *exec.Cmd {
	path := filepath.Join(c.pgBin, prog)
	var cmd *exec.Cmd
	if c.runAs != "" {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", c.runAs, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// createDB creates database name and returns its URL.
func (c *cluster) createDB(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, c.url("postgres"))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return c.url(name), nil
}

// dropDB drops database name.
func (c *cluster) dropDB(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.url("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// settings returns the server's version and the settings the figures depend on.
func (c *cluster) settings(ctx context.Context) (map[string]string, error) {
	conn, err := pgx.Connect(ctx, c.url("postgres"))
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT name, setting FROM pg_settings WHERE name = ANY($1)`,
		[]string{"server_version", "autovacuum", "autovacuum_naptime", "autovacuum_vacuum_scale_factor",
			"autovacuum_vacuum_insert_scale_factor", "shared_buffers", "synchronous_commit", "fsync", "max_wal_size"})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var k, v string
	_, err = pgx.ForEachRow(rows, []any{&k, &v}, func() error { out[k] = v; return nil })
	return out, err
}

// stop stops the server (fast: open sessions are ended) and removes the
// directory. It is safe to call more than once, and after a failed start.
func (c *cluster) stop() {
	if c == nil || c.dir == "" {
		return
	}
	if _, err := os.Stat(filepath.Join(c.data(), "postmaster.pid")); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := c.command(ctx, "pg_ctl", "-D", c.data(), "-m", "fast", "-w", "stop").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "soak: pg_ctl stop: %v\n%s", err, out)
		}
	}
	if c.keepLog != "" {
		if b, err := os.ReadFile(c.logFile()); err != nil {
			fmt.Fprintf(os.Stderr, "soak: the server's log: %v\n", err)
		} else if err := os.WriteFile(c.keepLog, b, 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "soak: keep the server's log: %v\n", err)
		}
	}
	if err := os.RemoveAll(c.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "soak: remove %s: %v\n", c.dir, err)
	}
	c.dir = ""
}

// tailLog returns the last n lines of the server's log, for an error message.
func (c *cluster) tailLog(n int) string {
	b, _ := os.ReadFile(c.logFile())
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

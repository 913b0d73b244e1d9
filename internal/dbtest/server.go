package dbtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// Server is a Postgres server of a test's own, in a temporary directory, for
// tests that stop and restart the database: the shared server serves every
// other test running alongside.
type Server struct {
	t    testing.TB
	bin  string // the directory holding initdb and pg_ctl
	dir  string
	port int
	// settings are the server's command-line settings beyond where it
	// listens.
	settings string
	// asPostgres runs the server's commands as the postgres user when the test
	// runs as root, which initdb refuses.
	asPostgres bool
}

// StartServer initializes and starts a server on a free port, and stops it and
// removes its files at t's cleanup. It fails t when Postgres's server binaries
// are missing: `bash .ci/run` installs them.
func StartServer(t testing.TB) *Server {
	t.Helper()
	// fsync off: the tests that restart a server wait for its flushes
	// otherwise, and prove nothing by it (Crash loses what was not written,
	// flushed or not).
	return startServer(t, "-c fsync=off -c max_connections=50")
}

// StartDefaultServer is StartServer with initdb's settings (fsync,
// synchronous_commit and autovacuum on, shared_buffers 128MB,
// max_connections 100), as a production server would have them: for the
// benchmarks that measure latency or sustained load, which the shared
// server's settings (autovacuum off) and its other databases would skew.
func StartDefaultServer(t testing.TB) *Server {
	t.Helper()
	return startServer(t, "")
}

func startServer(t testing.TB, settings string) *Server {
	t.Helper()
	bin, err := serverBinDir()
	if err != nil {
		t.Fatalf("a test Postgres server: %v", err)
	}
	dir, err := os.MkdirTemp("", "outbox-pg-")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, bin: bin, dir: filepath.Join(dir, "data"), port: FreePort(t), settings: settings, asPostgres: os.Geteuid() == 0}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if s.asPostgres {
		// The postgres user must be able to reach and own the data directory.
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	s.run("initdb", "-D", s.dir, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
	// Registered before the start: a start that times out may have left a
	// postmaster behind. Cleanups run last-registered first, so this stop
	// comes before the directory's removal.
	t.Cleanup(func() { _ = s.command("pg_ctl", "-D", s.dir, "-m", "immediate", "-w", "stop").Run() })
	s.Start()
	return s
}

// URL returns the server's connection URL.
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Start starts the stopped server and waits until it accepts connections.
func (s *Server) Start() {
	s.t.Helper()
	opts := strings.TrimSpace(fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 %s", s.port, s.dir, s.settings))
	s.run("pg_ctl", "-D", s.dir, "-o", opts, "-l", filepath.Join(s.dir, "server.log"), "-w", "start")
}

// Stop stops the server the way a restart does (fast: sessions are ended, open
// transactions rolled back) and waits until it is down.
func (s *Server) Stop() {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.dir, "-m", "fast", "-w", "stop")
}

// Crash stops the server the way a crash does (immediate: every process
// quits at once, nothing is flushed, recovery replays the WAL at the next
// start) and waits until it is down. What was committed without waiting for
// the WAL's flush (synchronous_commit off) may be lost.
func (s *Server) Crash() {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.dir, "-m", "immediate", "-w", "stop")
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	path := filepath.Join(s.bin, name)
	if s.asPostgres {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

func (s *Server) run(name string, args ...string) {
	s.t.Helper()
	if out, err := s.command(name, args...).CombinedOutput(); err != nil {
		s.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// serverBinDir finds initdb: through pg_config, else in Debian's newest
// /usr/lib/postgresql/<version>/bin.
func serverBinDir() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(dir string) int {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
		return v
	}
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) < version(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", fmt.Errorf("initdb not found (pg_config --bindir, /usr/lib/postgresql/*/bin): install Postgres's server package (apt-get install postgresql)")
}

// FreePort returns a loopback port nothing listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// writer offers rows at a fixed rate: transactions of rowsPerTx rows, each one
// INSERT statement in autocommit, spread over conns connections. Every payload
// starts with "soak <txn> <row> ", so that the harness, reading the sweeper's
// output, knows which row arrived and when the writer saw it commit: lag is
// measured end to end, whatever the storage layout.
type writer struct {
	pool      *pgxpool.Pool
	insert    string
	topics    []string
	size      int
	rowsPerTx int
	conns     int

	rate atomic.Int64 // rows a second offered; may change while it runs

	committed atomic.Int64 // rows
	errors    atomic.Int64 // failed transactions
	behind    atomic.Int64 // transactions not started in time: the writer could not keep the rate

	mu      sync.Mutex
	commits []int64 // by transaction: unix nanoseconds when its commit returned; -1 failed; 0 in flight
	lastErr error
}

// run offers rows until ctx ends. A scheduler adds rate/rowsPerTx
// transactions' credit every 5ms and hands each due transaction to a free
// connection; when all are busy for longer than half a second, the credit
// beyond that is dropped and counted in behind rather than caught up in a
// burst, so the offered rate shows what the writer could do.
//
// Each statement runs under execCtx, not ctx: when ctx ends the statements in
// flight finish, so that every transaction the server committed is counted.
func (w *writer) run(ctx, execCtx context.Context) {
	jobs := make(chan int64, w.conns)
	var wg sync.WaitGroup
	for range w.conns {
		wg.Go(func() {
			topics := make([]string, w.rowsPerTx)
			payloads := make([][]byte, w.rowsPerTx)
			for i := range payloads {
				payloads[i] = bytes.Repeat([]byte("x"), w.size)
			}
			for txn := range jobs {
				for k := range w.rowsPerTx {
					row := txn*int64(w.rowsPerTx) + int64(k)
					topics[k] = w.topics[row%int64(len(w.topics))]
					p := payloads[k]
					for i := range min(len(p), 32) {
						p[i] = 'x'
					}
					copy(p, fmt.Sprintf("soak %d %d ", txn, k))
				}
				_, err := w.pool.Exec(execCtx, w.insert, topics, payloads)
				at := time.Now().UnixNano()
				w.mu.Lock()
				if err != nil {
					at = -1
					w.lastErr = err
				}
				w.commits[txn] = at
				w.mu.Unlock()
				if err != nil {
					w.errors.Add(1)
					continue
				}
				w.committed.Add(int64(w.rowsPerTx))
			}
		})
	}
	defer wg.Wait()
	defer close(jobs)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	last := time.Now()
	var credit float64
	var next int64
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			perTx := float64(w.rate.Load()) / float64(w.rowsPerTx)
			credit += perTx * now.Sub(last).Seconds()
			last = now
			if limit := max(perTx/2, 1); credit > limit {
				w.behind.Add(int64(credit - limit))
				credit = limit
			}
			for ; credit >= 1; credit-- {
				w.mu.Lock()
				w.commits = append(w.commits, 0)
				w.mu.Unlock()
				select {
				case jobs <- next:
					next++
				default:
					w.mu.Lock()
					w.commits = w.commits[:len(w.commits)-1]
					w.mu.Unlock()
					goto busy
				}
			}
		busy:
		}
	}
}

// reader reads the sweeper's standard output, the stdout producer's lines
// ({"id":…,"payload":"<base64>"}), and records each of the writer's rows as it
// arrives: the delivery lag (arrival less the writer's commit), duplicates,
// and the oldest row not yet arrived.
type reader struct {
	w *writer

	mu       sync.Mutex
	seen     []uint8 // by transaction: a bit per row arrived
	low      int64   // every transaction below low has arrived whole (or failed)
	lags     []float32
	unique   int64
	relayed  int64 // lines, ours or not, duplicates included
	dups     int64
	foreign  int64 // lines whose payload is not the writer's
	earliest int64 // rows that arrived before the writer heard their commit (lag counted 0)
}

var payloadKey = []byte(`"payload":"`)

func (r *reader) run(out io.Reader) error {
	br := bufio.NewReaderSize(out, 1<<20)
	full := uint8(1<<r.w.rowsPerTx - 1)
	buf := make([]byte, 64)
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A line longer than the buffer: not one of ours. Skip the rest.
			for err == bufio.ErrBufferFull {
				_, err = br.ReadSlice('\n')
			}
			r.mu.Lock()
			r.relayed++
			r.foreign++
			r.mu.Unlock()
			continue
		}
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		now := time.Now().UnixNano()
		txn, k, ok := parsePayload(line, buf)
		r.mu.Lock()
		r.relayed++
		if !ok || txn < 0 || k < 0 || k >= r.w.rowsPerTx {
			r.foreign++
			r.mu.Unlock()
			continue
		}
		for int64(len(r.seen)) <= txn {
			r.seen = append(r.seen, 0)
		}
		bit := uint8(1) << k
		if r.seen[txn]&bit != 0 {
			r.dups++
			r.mu.Unlock()
			continue
		}
		r.seen[txn] |= bit
		r.unique++
		r.w.mu.Lock()
		var at int64
		if txn < int64(len(r.w.commits)) {
			at = r.w.commits[txn]
		}
		r.w.mu.Unlock()
		if at > 0 {
			r.lags = append(r.lags, float32(time.Duration(now-at).Seconds()))
		} else {
			r.lags = append(r.lags, 0)
			r.earliest++
		}
		if r.seen[txn] == full {
			r.advance(full)
		}
		r.mu.Unlock()
	}
}

// advance moves low past the transactions that arrived whole or failed. It is
// called with r.mu held.
func (r *reader) advance(full uint8) {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	for r.low < int64(len(r.w.commits)) {
		if (r.low < int64(len(r.seen)) && r.seen[r.low] == full) || r.w.commits[r.low] < 0 {
			r.low++
			continue
		}
		break
	}
}

// oldest returns the age of the oldest committed row not yet arrived (0 when
// none is outstanding): the lag as the applications' consumers see it.
func (r *reader) oldest(now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	full := uint8(1<<r.w.rowsPerTx - 1)
	r.advance(full)
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	// The oldest outstanding transaction is low, unless it is still in
	// flight (its commit not returned yet), then the next committed one.
	for i := r.low; i < int64(len(r.w.commits)); i++ {
		at := r.w.commits[i]
		if at > 0 && (i >= int64(len(r.seen)) || r.seen[i] != full) {
			return now.Sub(time.Unix(0, at))
		}
		if at == 0 { // in flight: younger than anything committed after it would be
			continue
		}
	}
	return 0
}

// parsePayload reads "soak <txn> <row> " from the start of the line's base64
// payload.
func parsePayload(line, buf []byte) (txn int64, k int, ok bool) {
	i := bytes.LastIndex(line, payloadKey) // the last field: headers may hold the key too
	if i < 0 {
		return 0, 0, false
	}
	enc := line[i+len(payloadKey):]
	enc = enc[:min(len(enc), 44)] // 33 bytes: "soak " and two numbers fit
	if j := bytes.IndexByte(enc, '"'); j >= 0 {
		enc = enc[:j]
	}
	enc = enc[:len(enc)/4*4]
	n, err := base64.StdEncoding.Decode(buf, enc)
	if err != nil {
		return 0, 0, false
	}
	f := bytes.Fields(buf[:n])
	if len(f) < 3 || string(f[0]) != "soak" {
		return 0, 0, false
	}
	t, err1 := strconv.ParseInt(string(f[1]), 10, 64)
	r, err2 := strconv.Atoi(string(f[2]))
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return t, r, true
}

// sweeper is the binary under test, running as users run it, its standard
// output (the stdout producer's messages) read by the harness.
type sweeper struct {
	cmd  *exec.Cmd
	done chan error    // the reader's end
	eof  chan struct{} // closed when its output ends: it has exited
}

// startSweeper runs bin with args (after "run --database-url url"), its
// standard output handed to consume. Its environment is PATH only, so that no
// OUTBOX_ variable of the shell changes what is measured.
func startSweeper(bin, url string, args []string, consume func(io.Reader) error) (*sweeper, error) {
	cmd := exec.Command(bin, append([]string{"run", "--database-url", url}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A pipe of our own rather than StdoutPipe, whose reading end Wait
	// closes: the reader reads to EOF, which comes when the process exits.
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = pw
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, err
	}
	s := &sweeper{cmd: cmd, done: make(chan error, 1), eof: make(chan struct{})}
	go func() {
		defer pr.Close()
		err := consume(pr)
		close(s.eof)
		s.done <- err
	}()
	return s, nil
}

// stop sends SIGTERM, waits up to 30s for the process (then kills its process
// group), then for the reader to reach the end of its output, and returns the
// exit error or the reader's.
func (s *sweeper) stop() error {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		err = fmt.Errorf("the sweeper did not stop within 30s of SIGTERM: killed")
	}
	select {
	case rerr := <-s.done:
		if err == nil {
			err = rerr
		}
	case <-time.After(10 * time.Second):
		if err == nil {
			err = fmt.Errorf("its output did not end 10s after it exited")
		}
	}
	return err
}

// countLines counts newlines until EOF, signalling on first when the first
// bytes come and on reached when n lines have been read.
func countLines(out io.Reader, n int64, first, reached chan<- time.Time) error {
	buf := make([]byte, 1<<20)
	var seen int64
	for {
		m, err := out.Read(buf)
		if m > 0 && first != nil {
			first <- time.Now()
			first = nil
		}
		seen += int64(bytes.Count(buf[:m], []byte{'\n'}))
		if seen >= n && n > 0 {
			reached <- time.Now()
			n = 0
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// percentile returns the p-th percentile (0-100) of xs, sorting them.
func percentile(xs []float32, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	i := int(p / 100 * float64(len(xs)-1))
	return float64(xs[i])
}

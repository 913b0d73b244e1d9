// Package alert tells a person that something needs them: the dependency
// breaker opening, a topic tripping, dead letters piling up. An [Alerter]
// delivers; [Webhook] posts JSON to a URL, [Log] writes to the sweeper's log.
//
// Alerts never carry a payload or headers: they may hold personal data. They
// name topics, counts, reasons and correlation ids.
package alert

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"time"
)

// Severities.
const (
	Critical = "critical"
	Warning  = "warning" // a deliberate change by an operator
	Info     = "info"
)

// Alert is one alert, as the webhook receives it.
type Alert struct {
	Time      time.Time `json:"timestamp"`
	Severity  string    `json:"severity"`
	Component string    `json:"component"`
	Summary   string    `json:"summary"`
	// Table, Count, CorrelationIDs and Reasons describe dead letters; Action
	// tells the operator what to do. Empty when they do not apply.
	Table          string   `json:"table,omitempty"`
	Count          int      `json:"count,omitempty"`
	CorrelationIDs []string `json:"correlation_ids,omitempty"`
	Reasons        []string `json:"reasons,omitempty"`
	Action         string   `json:"action,omitempty"`
}

// Alerter delivers alerts. Implementations must be safe for concurrent use.
type Alerter interface {
	Alert(ctx context.Context, a Alert) error
}

// Log writes alerts to a logger: critical ones at error level.
type Log struct{ Logger *slog.Logger }

// Alert logs a.
func (l Log) Alert(ctx context.Context, a Alert) error {
	level := slog.LevelInfo
	if a.Severity == Critical {
		level = slog.LevelError
	}
	attrs := []any{"alert", true, "severity", a.Severity, "component", a.Component}
	if a.Count > 0 {
		attrs = append(attrs, "count", a.Count, "correlation_ids", a.CorrelationIDs, "reasons", a.Reasons)
	}
	l.Logger.Log(ctx, level, a.Summary, attrs...)
	return nil
}

// Webhook posts each alert as JSON to URL.
type Webhook struct {
	URL    string
	Client *http.Client // defaults to a client with a 10s timeout
}

// Alert posts a; any answer but 2xx is an error naming the status.
func (w Webhook) Alert(ctx context.Context, a Alert) error {
	body, err := json.Marshal(a)
	if err != nil {
		return fmt.Errorf("encode alert: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("alert webhook %s: %w", w.where(), err)
	}
	req.Header.Set("Content-Type", "application/json")
	client := w.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		// The client's error repeats the URL, which may hold a token: say where
		// only.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return fmt.Errorf("post alert to %s: %w", w.where(), err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("post alert to %s: %s", w.where(), resp.Status)
	}
	return nil
}

// where names the receiver without its path and query, which often carry a
// token (chat and paging services put it there).
func (w Webhook) where() string {
	u, err := url.Parse(w.URL)
	if err != nil {
		return "the alert webhook"
	}
	return u.Scheme + "://" + u.Host
}

// Both sends every alert to each of its alerters, and returns the first error.
type Both []Alerter

// Alert sends a to every alerter.
func (b Both) Alert(ctx context.Context, a Alert) error {
	var first error
	for _, x := range b {
		if err := x.Alert(ctx, a); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Queue delivers alerts in the background, so that whoever raises one (a
// breaker changing state in the middle of a sweep) never waits on a slow
// receiver. Alerts beyond its buffer are logged and dropped. Close delivers
// what is queued, within its context.
type Queue struct {
	next   Alerter
	logger *slog.Logger
	ch     chan Alert
	done   chan struct{}
}

// NewQueue starts a queue in front of next.
func NewQueue(next Alerter, logger *slog.Logger) *Queue {
	q := &Queue{next: next, logger: logger, ch: make(chan Alert, 256), done: make(chan struct{})}
	go q.loop()
	return q
}

// Alert queues a and returns at once.
func (q *Queue) Alert(_ context.Context, a Alert) error {
	select {
	case q.ch <- a:
		return nil
	default:
		q.logger.Error("alert queue full: alert dropped", "severity", a.Severity, "component", a.Component, "summary", a.Summary)
		return fmt.Errorf("alert queue full")
	}
}

func (q *Queue) loop() {
	defer close(q.done)
	for a := range q.ch {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := q.next.Alert(ctx, a); err != nil {
			q.logger.Warn("alert not delivered", "component", a.Component, "err", err)
		}
		cancel()
	}
}

// Close stops taking alerts and waits, at most until ctx ends, for the queued
// ones to be delivered. Call it once.
func (q *Queue) Close(ctx context.Context) {
	close(q.ch)
	select {
	case <-q.done:
	case <-ctx.Done():
	}
}

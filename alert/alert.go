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
	// Key names the condition the alert is about: its kind, and the topic
	// when there is one ("broker-circuit-breaker", "topic-breaker/orders").
	// Status says whether it fires or has resolved. A [Notifier] groups the
	// alerts of one key. Empty for one-off notices.
	Key    string `json:"key,omitempty"`
	Status string `json:"status,omitempty"`
	// Repeats counts the alerts of the key grouped into this one since its
	// last notification; FiringSince is when the condition began.
	Repeats     int        `json:"repeats,omitempty"`
	FiringSince *time.Time `json:"firing_since,omitempty"`
	// Outbox names the outbox the alert is about when the relay serves
	// many (its name in the admin API: the schema, or database.schema);
	// empty for a relay of one. See [Outbox].
	Outbox string `json:"outbox,omitempty"`
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
	if a.Status == Resolved {
		level = slog.LevelInfo
	}
	attrs := []any{"alert", true, "severity", a.Severity, "component", a.Component}
	if a.Outbox != "" {
		attrs = append(attrs, "outbox", a.Outbox)
	}
	if a.Key != "" {
		attrs = append(attrs, "key", a.Key, "status", a.Status, "repeats", a.Repeats)
	}
	if a.Count > 0 {
		attrs = append(attrs, "count", a.Count, "correlation_ids", a.CorrelationIDs, "reasons", a.Reasons)
	}
	l.Logger.Log(ctx, level, a.Summary, attrs...)
	return nil
}

// Outbox names the outbox on every alert it passes to Alerter. A relay of
// many outboxes gives each its own: the same topic tripping in two tenants
// is then two conditions (a [Notifier] groups by outbox and key), each
// naming its tenant, and neither resolves the other.
type Outbox struct {
	Alerter Alerter
	Name    string
}

// Alert sets a.Outbox, unless it is set already, and passes a on.
func (o Outbox) Alert(ctx context.Context, a Alert) error {
	if a.Outbox == "" {
		a.Outbox = o.Name
	}
	return o.Alerter.Alert(ctx, a)
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
		err := fmt.Errorf("post alert to %s: %s", w.where(), resp.Status)
		// Refusals of the alert itself; a 401, 403 or 404 may be a receiver
		// being redeployed or its token rotated, and is tried again.
		switch resp.StatusCode {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
			return &RefusedError{Err: err}
		}
		return err
	}
	return nil
}

// RefusedError is a receiver's refusal of an alert for what it is (400, 413,
// 415 or 422: a payload too large, a format it does not take): sent again, it
// is refused again. The
// notifier drops it at once, rather than hold every alert behind it for
// RetryFor.
type RefusedError struct{ Err error }

func (e *RefusedError) Error() string { return e.Err.Error() + " (refused: not sent again)" }
func (e *RefusedError) Unwrap() error { return e.Err }

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

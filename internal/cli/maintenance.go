package cli

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"time"

	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/metrics"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/relay"
)

// maintenanceOptions are the flags of the services that run beside the sweeper:
// retention, the dead-letter probe, and where alerts go.
type maintenanceOptions struct {
	alertWebhookURL   string
	alertRepeat       time.Duration
	alertGroupWindow  time.Duration
	dlqAlertThreshold int
	dlqProbeSchedule  string
	dlqRetention      time.Duration
	retention         time.Duration
	retentionSchedule string
}

func (o *maintenanceOptions) register(f *flags) {
	f.String(&o.alertWebhookURL, "alert-webhook-url", "", "url", "POST alerts (dead letters, breaker changes, storms) as JSON to this URL; they are logged either way")
	f.Duration(&o.alertRepeat, "alert-repeat-interval", alert.RepeatIntervalDefault, "a condition that goes on (the broker breaker open, a topic tripped) is alerted again at most this often; the changes in between are counted in the next alert")
	f.Duration(&o.alertGroupWindow, "alert-group-window", alert.GroupWindowDefault, "a condition that clears and comes back within this window is one incident: no resolved alert, no new one (negative: resolved alerts go out at once)")
	f.Int(&o.dlqAlertThreshold, "dlq-alert-threshold", outbox.DeadLetterThresholdDefault, "dead letters at which the probe alerts (once per growth)")
	f.String(&o.dlqProbeSchedule, "dlq-probe-schedule", "@every 1m", "spec", "cron spec of the dead-letter probe (one outbox; with many, each runs with its retention)")
	f.Duration(&o.dlqRetention, "dlq-retention", 0, "delete dead letters older than this (0: keep until purged)")
	f.Duration(&o.retention, "retention", outbox.RetentionDefault, "keep dispatched rows this long: history partitions, each a seventh of it wide (1s to 1 day), are dropped whole once older (-1ns or any negative: keep)")
	f.String(&o.retentionSchedule, "retention-schedule", "@every 1m", "spec", "cron spec of retention")
}

// alerters returns the two ways alerts leave: the probe's (the log, and the
// webhook if one is set, posted at once: the probe retries what did not go
// out at its next run) and the notifier the breakers' alerts go through (it
// groups a condition's alerts, and posts in the background, retrying, so that
// a slow receiver never holds the relay).
func (o *maintenanceOptions) alerters(f *flags, logger *slog.Logger, m *metrics.Metrics) (alert.Alerter, *alert.Notifier, error) {
	if o.alertRepeat < time.Second {
		return nil, nil, usagef("%s is %s: it must be at least 1s, such as 4h", f.origin("alert-repeat-interval"), o.alertRepeat)
	}
	if o.alertGroupWindow == 0 {
		return nil, nil, usagef("%s is 0s: give a window such as 1m, or a negative value to send resolved alerts at once", f.origin("alert-group-window"))
	}
	log := alert.Log{Logger: logger}
	var webhook alert.Alerter
	probe := alert.Alerter(log)
	if o.alertWebhookURL != "" {
		// A webhook's path and query are its secret (Slack's and Teams'
		// tokens live there): an error names the scheme and host alone.
		u, err := url.Parse(o.alertWebhookURL)
		switch {
		case err != nil:
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err // url.Error quotes the URL whole
			}
			return nil, nil, usagef("invalid value for %s: %v (its path and query are not shown: they may hold its token)", f.origin("alert-webhook-url"), err)
		case (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			return nil, nil, usagef("invalid value for %s (scheme %q, host %q; its path and query are not shown: they may hold its token): write an http:// or https:// URL",
				f.origin("alert-webhook-url"), u.Scheme, u.Host)
		}
		webhook = alert.Webhook{URL: o.alertWebhookURL}
		probe = alert.Both{log, webhook}
	}
	n := alert.NewNotifier(webhook, alert.NotifierConfig{RepeatInterval: o.alertRepeat, GroupWindow: o.alertGroupWindow,
		Echo: log, Logger: logger, OnDrop: func(_ alert.Alert, why string) { m.AlertDropped(why) }})
	return probe, n, nil
}

// services validates the flags of the maintenance services and sets them in
// opts: retention and the dead-letter probe, each on its schedule, the probe
// alerting through alerter.
func (o *maintenanceOptions) services(f *flags, opts *relay.Options, alerter alert.Alerter) error {
	if o.dlqAlertThreshold < 1 {
		return usagef("%s is %d: it must be at least 1", f.origin("dlq-alert-threshold"), o.dlqAlertThreshold)
	}
	if o.dlqRetention < 0 {
		return usagef("%s is %s: it must not be negative (0 keeps dead letters until purged)", f.origin("dlq-retention"), o.dlqRetention)
	}
	retentionSched, err := parseSchedule(f, "retention-schedule", o.retentionSchedule)
	if err != nil {
		return err
	}
	probeSched, err := parseSchedule(f, "dlq-probe-schedule", o.dlqProbeSchedule)
	if err != nil {
		return err
	}
	dispatched := o.retention
	if dispatched == 0 {
		return usagef("%s is 0s: give a duration, or a negative one to keep dispatched rows", f.origin("retention"))
	}
	opts.Retention = outbox.RetentionConfig{Dispatched: dispatched, DeadLetters: o.dlqRetention}
	opts.RetentionSchedule = retentionSched
	opts.Probe = outbox.ProbeConfig{Threshold: o.dlqAlertThreshold, Alerter: alerter}
	opts.ProbeSchedule = probeSched
	return nil
}

// alertTopicChanges wraps a topic breaker hook so every change of a topic's
// state is alerted too: one alert per change, not per tick.
func alertTopicChanges(log func(string, breaker.State, breaker.State, string), alerter alert.Alerter,
	observe func(string, breaker.State, breaker.State, string)) func(string, breaker.State, breaker.State, string) {
	return func(topic string, from, to breaker.State, reason string) {
		log(topic, from, to, reason)
		observe(topic, from, to, reason)
		// One condition per topic: tripped and half-open fire it (the
		// notifier groups a topic that trips again after each trial), closed
		// resolves it.
		severity, status := alert.Info, alert.Firing
		switch {
		case to == breaker.StateTripped && breaker.ByOperator(reason):
			severity = alert.Warning // an operator's decision, not a fault found
		case to == breaker.StateTripped:
			severity = alert.Critical
		case to == breaker.StateClosed:
			status = alert.Resolved
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = alerter.Alert(ctx, alert.Alert{Time: time.Now().UTC(), Severity: severity, Component: "topic-breaker",
			Key: breaker.AlertKeyTopic(topic), Status: status, Summary: "topic " + topic + " " + to.String() + ": " + reason})
	}
}

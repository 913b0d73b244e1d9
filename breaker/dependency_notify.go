package breaker

import (
	"context"
	"fmt"
	"time"

	"github.com/outbox-sweeper/sweeper/alert"
)

func (d *Dependency) notify(c stateChange) {
	select {
	case d.changes <- c:
	default: // a burst of changes beyond the buffer: the state is what counts
	}
}

func (d *Dependency) notifyLoop() {
	defer d.wg.Done()
	for {
		select {
		case c := <-d.changes:
			d.deliver(c)
		case <-d.done:
			for { // deliver what came before Close
				select {
				case c := <-d.changes:
					d.deliver(c)
				default:
					return
				}
			}
		}
	}
}

// AlertKeyBroker is the key of the broker breaker's alerts; AlertKeyTopic
// returns a topic breaker's.
const AlertKeyBroker = "broker-circuit-breaker"

// AlertKeyTopic returns the key of topic's breaker alerts.
func AlertKeyTopic(topic string) string { return "topic-breaker/" + topic }

// deliver tells the observer, then the alerter, about one change.
func (d *Dependency) deliver(c stateChange) {
	reason := changeReason(c, d.cfg)
	if d.cfg.OnStateChange != nil {
		d.cfg.OnStateChange(c.from, c.to, reason)
	}
	if d.cfg.Alerter == nil {
		return
	}
	// One condition, keyed: open and half-open fire it (a notifier groups the
	// reopenings of a long outage), closed resolves it.
	severity, status := alert.Info, alert.Firing
	switch {
	case c.to == DependencyOpen && c.manual != "":
		severity = alert.Warning // an operator's decision, not an outage found
	case c.to == DependencyOpen:
		severity = alert.Critical
	case c.to == DependencyClosed:
		status = alert.Resolved
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = d.cfg.Alerter.Alert(ctx, alert.Alert{Time: time.Now().UTC(), Severity: severity, Component: "dependency-breaker",
		Key: AlertKeyBroker, Status: status, Summary: fmt.Sprintf("broker circuit breaker %s: %s", c.to, reason)})
}

func changeReason(c stateChange, cfg DependencyConfig) string {
	switch {
	case c.manual != "":
		return c.manual
	case c.from == DependencyClosed && c.to == DependencyOpen:
		return fmt.Sprintf("%d sends in a row failed (last: %s); no send for %s", cfg.Failures, c.lastErr, cfg.OpenDuration)
	case c.to == DependencyHalfOpen:
		return fmt.Sprintf("open for %s: one trial batch goes through", cfg.OpenDuration)
	case c.from == DependencyHalfOpen && c.to == DependencyOpen:
		return fmt.Sprintf("the trial batch failed (%s); no send for %s", c.lastErr, cfg.OpenDuration)
	case c.to == DependencyClosed:
		return "the trial batch succeeded"
	default:
		return ""
	}
}

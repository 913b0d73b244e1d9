package metrics

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
)

// FuzzLabels feeds arbitrary topics, classes and reasons through every
// observer method, the breaker hook and the tripped list, then gathers the
// registry as a scrape would: nothing may panic, and every label value must be
// valid UTF-8 and at most MaxLabelBytes long.
//
//	go test -run '^$' -fuzz FuzzLabels -fuzztime 60s ./metrics/
func FuzzLabels(f *testing.F) {
	f.Add("orders", "transient", "tripped by hand", 0)
	f.Add("\xff\xfe", "\xff", "bad\xffreason", int(producer.ClassBroker))
	f.Add(strings.Repeat("é", 5000), strings.Repeat("\x80", 300), "", -1)
	f.Add(`a\xff`, "class(7)", "\uFFFD", 7)
	f.Add(strings.Repeat("a", MaxLabelBytes), strings.Repeat("a", MaxLabelBytes+1), "\x00", 1<<40)
	f.Add("\xf0\x9f\x98", "\xed\xa0\x80", "\xc0\xaf", 3) // a cut 4-byte rune, a surrogate, an overlong '/'
	f.Fuzz(func(t *testing.T, topic, class, reason string, classNum int) {
		reg := prometheus.NewRegistry()
		m := New(reg)
		for _, tp := range []string{topic, class, reason} {
			m.BatchDispatched(tp, 1, []time.Duration{time.Millisecond})
			m.BatchFailed(tp, producer.Class(classNum))
			m.DeadLettered(tp, 1)
			m.OnTopicChange(tp, breaker.StateClosed, breaker.StateTripped, reason)
			m.OnTopicChange(tp, breaker.StateTripped, breaker.StateHalfOpen, reason)
			m.Errors(tp, class).Inc()
		}
		m.SweepDone(time.Millisecond)
		m.Listening(true)
		m.OnDependencyChange(breaker.DependencyClosed, breaker.DependencyOpen, reason)
		families, err := reg.Gather()
		if err != nil {
			t.Fatalf("gather: %v", err)
		}
		m.setTripped([]breaker.TopicStatus{{Topic: topic, LastError: reason}, {Topic: class}, {Topic: reason}})
		refreshed, err := reg.Gather()
		if err != nil {
			t.Fatalf("gather after the tripped list: %v", err)
		}
		for _, fam := range append(families, refreshed...) {
			for _, metric := range fam.GetMetric() {
				for _, l := range metric.GetLabel() {
					if v := l.GetValue(); !utf8.ValidString(v) || len(v) > MaxLabelBytes {
						t.Fatalf("%s{%s=%q}: %d bytes, valid UTF-8 %v", fam.GetName(), l.GetName(), v, len(v), utf8.ValidString(v))
					}
				}
			}
		}

		// What the helper promises beyond safety.
		for _, s := range []string{topic, class, reason} {
			if got := label(s); utf8.ValidString(s) && len(s) <= MaxLabelBytes && got != s {
				t.Fatalf("label(%q) = %q: a valid, short value must be kept as is", s, got)
			}
			if label(s) != label(s) {
				t.Fatalf("label(%q) is not stable", s)
			}
		}
		// Two values share a label only through a hash collision (not within
		// reach), or when one spells an escape or a cut with valid text: a
		// literal `\xff`, or text that is itself a cut label.
		if topic != class && label(topic) == label(class) {
			spelled := func(s string) bool { return strings.Contains(s, `\`) || strings.Contains(s, "…") }
			if !spelled(topic) && !spelled(class) {
				t.Fatalf("%q and %q share the label %q", topic, class, label(topic))
			}
		}
	})
}

package producer

import (
	"context"
	"fmt"
	"strings"
)

// Destination is a template of the name a row's topic is sent under when
// many outboxes share one broker: "{topic}" (the topic as the row spells it),
// "{schema}.{topic}" (the tenant's schema before it), "{database}.{topic}"
// (the tenant's database before it, for a database per tenant whose outboxes
// all sit in one schema, public), or any text around those placeholders.
// "{topic}" must appear, so that two topics of one outbox never go to one
// destination.
type Destination string

// DestinationDefault sends each topic under its own name.
const DestinationDefault Destination = "{topic}"

// placeholders are the names a Destination may hold, as its errors list them.
const placeholders = "{database}, {schema} and {topic}"

// Validate reports a template that does not name the topic, names a
// placeholder other than {database}, {schema} and {topic}, or joins {schema}
// and {topic} with text a schema's name may hold.
func (d Destination) Validate() error {
	rest := string(d)
	if !strings.Contains(rest, "{topic}") {
		return fmt.Errorf("destination template %q does not contain {topic}: write it as {topic}, or {schema}.{topic} to put the tenant's schema before it ({database}.{topic} for a database per tenant)", string(d))
	}
	for {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			return d.schemaApart()
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return fmt.Errorf("destination template %q has an unclosed {: the placeholders are %s", string(d), placeholders)
		}
		if p := rest[i : i+j+1]; p != "{database}" && p != "{schema}" && p != "{topic}" {
			return fmt.Errorf("destination template %q names %s: the placeholders are %s", string(d), p, placeholders)
		}
		rest = rest[i+j+1:]
	}
}

// schemaApart refuses a template whose {schema} is joined to {topic} by text
// a schema's name may hold (lower-case letters, digits, _; the fleet relays
// no other), or by none: with {schema}_{topic}, tenant t1's topic a_b and
// tenant t1_a's topic b both went to t1_a_b, one tenant's messages under
// another's name. Next to {database} it takes any text: a relay of one
// database fills in one name, and a list of databases leaves out a database
// whose name holds the text after {database}.
func (d Destination) schemaApart() error {
	parts := strings.Split(string(d), "{schema}")
	for i := range len(parts) - 1 {
		before, after := parts[i], parts[i+1]
		if k := strings.LastIndexByte(before, '}'); k >= 0 && strings.HasSuffix(before[:k+1], "{topic}") {
			if err := d.separates(before[k+1:]); err != nil {
				return err
			}
		}
		if k := strings.IndexByte(after, '{'); k >= 0 && strings.HasPrefix(after[k:], "{topic}") {
			if err := d.separates(after[:k]); err != nil {
				return err
			}
		}
	}
	return nil
}

// separates says whether sep, the text between {schema} and {topic}, holds
// a byte no schema name the fleet relays holds.
func (d Destination) separates(sep string) error {
	for _, c := range []byte(sep) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return nil
		}
	}
	return fmt.Errorf("destination template %q joins {schema} and {topic} with %q, which a schema's name may hold too: "+
		"two tenants' topics could share a destination (tenant t1's topic a_b and tenant t1_a's topic b); "+
		"separate them with a character no schema name holds, as in {schema}.{topic}", string(d), sep)
}

// For returns the function that names topic's destination for the outbox in
// schema of database. The placeholders are filled in one pass, so a
// database or schema whose name holds "{topic}" stays as it is.
func (d Destination) For(database, schema string) func(topic string) string {
	if d == "" || d == DestinationDefault {
		return func(topic string) string { return topic }
	}
	// The template split at {topic}, the other placeholders filled in each
	// part.
	parts := strings.Split(string(d), "{topic}")
	fill := strings.NewReplacer("{database}", database, "{schema}", schema)
	for i := range parts {
		parts[i] = fill.Replace(parts[i])
	}
	return func(topic string) string { return strings.Join(parts, topic) }
}

// Renamed returns p sending each topic under name(topic). The sweeper above
// it still sees the rows' own topics: batches come back from Batches under
// the topic they were asked for, so the topic's breaker, backoff and dead
// letters stay keyed by the row's topic while the broker sees the
// destination. Renamed keeps p's Checker and TopicChecker (asked about the
// destination). Close closes p.
func Renamed(p Producer, name func(topic string) string) Producer {
	r := renamed{p: p, name: name}
	c, isChecker := p.(Checker)
	tc, isTopicChecker := p.(TopicChecker)
	switch {
	case isChecker && isTopicChecker:
		return struct {
			renamed
			Checker
			renamedTopicChecker
		}{r, c, renamedTopicChecker{tc, name}}
	case isChecker:
		return struct {
			renamed
			Checker
		}{r, c}
	case isTopicChecker:
		return struct {
			renamed
			renamedTopicChecker
		}{r, renamedTopicChecker{tc, name}}
	}
	return r
}

type renamed struct {
	p    Producer
	name func(string) string
}

func (r renamed) Batches(ctx context.Context, topic string, msgs []Message) ([]Batch, error) {
	dest := r.name(topic)
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		m.Topic = dest
		out[i] = m
	}
	batches, err := r.p.Batches(ctx, dest, out)
	for i := range batches {
		batches[i].Topic = topic
		for j := range batches[i].Messages {
			batches[i].Messages[j].Topic = topic
		}
	}
	return batches, err
}

func (r renamed) Send(ctx context.Context, b Batch) error {
	dest := r.name(b.Topic)
	msgs := make([]Message, len(b.Messages))
	for i, m := range b.Messages {
		m.Topic = dest
		msgs[i] = m
	}
	return r.p.Send(ctx, Batch{Topic: dest, Messages: msgs})
}

func (r renamed) Close(ctx context.Context) error { return r.p.Close(ctx) }

type renamedTopicChecker struct {
	tc   TopicChecker
	name func(string) string
}

func (r renamedTopicChecker) CheckTopic(ctx context.Context, topic string) error {
	return r.tc.CheckTopic(ctx, r.name(topic))
}

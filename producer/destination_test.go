package producer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
)

// Each placeholder is filled with its own value, once: a database's name may
// hold braces (Postgres allows any name), and a topic may hold a
// placeholder's text; neither is read as a placeholder.
func TestDestinationFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tmpl, database, schema, topic, want string
	}{
		{"{topic}", "db1", "public", "orders", "orders"},
		{"{schema}.{topic}", "db1", "tenant_1", "orders", "tenant_1.orders"},
		{"{database}.{topic}", "db1", "public", "orders", "db1.orders"},
		{"{database}.{schema}.{topic}", "db1", "public", "orders", "db1.public.orders"},
		{"t/{database}/{topic}/{topic}", "db1", "s", "x", "t/db1/x/x"},
		{"{database}.{topic}", "odd{topic}{schema}", "public", "orders", "odd{topic}{schema}.orders"},
		{"{schema}.{topic}", "db1", "s", "{database}", "s.{database}"},
		{"{schema}-{topic}", "db1", "t_1", "a_b", "t_1-a_b"},
		{"ns.{topic}@{schema}", "db1", "t_1", "a", "ns.a@t_1"},
		{"{database}/{schema}/{topic}", "db1", "t_1", "a", "db1/t_1/a"},
		{"{database}_{schema}.{topic}", "db1", "t_1", "a", "db1_t_1.a"},
	} {
		require.NoError(t, producer.Destination(tc.tmpl).Validate(), tc.tmpl)
		require.Equal(t, tc.want, producer.Destination(tc.tmpl).For(tc.database, tc.schema)(tc.topic), "%q with %q", tc.tmpl, tc.database)
	}
}

func TestDestinationValidate(t *testing.T) {
	t.Parallel()
	for tmpl, want := range map[string]string{
		"{schema}.orders":       `does not contain {topic}`,
		"{tenant}.{topic}":      `names {tenant}: the placeholders are {database}, {schema} and {topic}`,
		"{database.{topic}":     `names {database.{topic}: the placeholders are`,
		"{topic}.{schema":       `has an unclosed {: the placeholders are {database}, {schema} and {topic}`,
		"{Database}.{topic}":    `names {Database}`,
		"{database}{schema}{x}": `does not contain {topic}`,
		// Text a schema's name may hold between {schema} and {topic}: two
		// tenants' topics could meet.
		"{schema}_{topic}":            `joins {schema} and {topic} with "_"`,
		"{schema}{topic}":             `joins {schema} and {topic} with ""`,
		"x.{topic}v2{schema}":         `joins {schema} and {topic} with "v2"`,
		"{topic}__{schema}":           `joins {schema} and {topic} with "__"`,
		"{database}.{schema}0{topic}": `joins {schema} and {topic} with "0"`,
	} {
		err := producer.Destination(tmpl).Validate()
		require.Error(t, err, tmpl)
		require.Contains(t, err.Error(), want, tmpl)
		require.Contains(t, err.Error(), `"`+tmpl+`"`, "the error quotes the template")
	}
}

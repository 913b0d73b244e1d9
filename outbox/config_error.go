package outbox

import "fmt"

// ConfigError reports a configuration value the sweeper does not accept. It names
// the field's command-line flag, so the binary can say which flag or environment
// variable to fix.
type ConfigError struct {
	// What is the setting in words, e.g. "page size".
	What string
	// Flag is the sweeper binary's flag for it, e.g. "page-size".
	Flag string
	// Value is the rejected value as the user would write it.
	Value string
	// Want says what is accepted.
	Want string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%s (--%s) is %s: %s", e.What, e.Flag, e.Value, e.Want)
}

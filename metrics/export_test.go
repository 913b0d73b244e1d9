package metrics

// ExpireTopics deletes the series of idle topics, as Refresh does, without a
// database.
func ExpireTopics(m *Metrics) { m.topics.expire() }

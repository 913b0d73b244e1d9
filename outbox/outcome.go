package outbox

import "github.com/outbox-sweeper/sweeper/producer"

// outcome is what sending did, at every scale: one batch sent or failed, the
// rows a page or a tick moved for their deadline, one topic's share of a page
// (topicSender.out). Where something happens its outcome is made once, told
// once (report: the observer, the activity counters and the log hear of it
// there and nowhere else), and added to the outcome above it (add), up to the
// sweep's SweepResult (SweepResult.add). A dead-lettered row is counted once,
// in its outcome's deadLettered.
type outcome struct {
	// topic is the topic sent; "" for rows of several topics.
	topic string
	// The counts, as SweepResult's; expired counts, among deadLettered, the
	// rows past their deadline; attempted, the rows that failed alone and
	// counted an attempt.
	batches, failedBatches, dispatched, skipped int
	deadLettered, expired, attempted, splits    int
	// failed, contended and tripped say why the topic stopped, if it did:
	// tripped, by the topic breaker after the sweep's plan (gatePass.tripped).
	failed, contended, tripped bool

	// What report tells of this outcome's own event; add does not carry it
	// up. sent is a batch the broker accepted; failure, the error of a batch
	// (or a cut) that failed, and deadReasons and deadCorrelationIDs what its
	// dead letters were (deadLettered counts them); expiredRows, the rows
	// moved past their deadline, by topic; unreadable, the rows moved because
	// they cannot be read.
	sent               producer.Batch
	failure            error
	deadReasons        map[string]int
	deadCorrelationIDs []string
	expiredRows        expiredTally
	unreadable         []unreadableRow
	// stormed says the failure's dead letters would have passed the storm
	// guard's limit: none moved, and the topic must trip.
	stormed bool
}

// unreadableRow is a claimed row moved to the dead-letter table because a
// column holds a value the sweeper cannot send, and why.
type unreadableRow struct {
	m   producer.Message
	why string
}

// add counts o in out. o's events are not carried up: report told them.
func (out *outcome) add(o outcome) {
	addCounts(out.counts(), o.counts())
	out.failed = out.failed || o.failed
	out.contended = out.contended || o.contended
	out.tripped = out.tripped || o.tripped
}

// add counts o in the sweep's result: a topic that failed joins
// FailedTopics.
func (r *SweepResult) add(o outcome) {
	addCounts(r.counts(), o.counts())
	if o.failed {
		r.FailedTopics = append(r.FailedTopics, o.topic)
	}
}

// merge adds o, another lane's result of the same sweep, to r. The failed
// topics of the lanes follow one another, each lane's in the order they
// failed; the later next tick holds.
func (r *SweepResult) merge(o SweepResult) {
	r.Pages += o.Pages
	addCounts(r.counts(), o.counts())
	r.FailedTopics = append(r.FailedTopics, o.FailedTopics...)
	r.Blocked = r.Blocked || o.Blocked
	r.more = r.more || o.more
	if o.due.After(r.due) {
		r.due = o.due
	}
}

// counts and SweepResult.counts list the same counts in the same order, so
// that one addCounts adds an outcome up at every scale.
func (out *outcome) counts() []*int {
	return []*int{&out.batches, &out.failedBatches, &out.dispatched, &out.skipped,
		&out.deadLettered, &out.expired, &out.attempted, &out.splits}
}

func (r *SweepResult) counts() []*int {
	return []*int{&r.Batches, &r.FailedBatches, &r.Dispatched, &r.Skipped,
		&r.DeadLettered, &r.Expired, &r.AttemptedRows, &r.Splits}
}

func addCounts(to, from []*int) {
	for i, n := range from {
		*to[i] += *n
	}
}

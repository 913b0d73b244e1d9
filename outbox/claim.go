package outbox

import (
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-sweeper/sweeper/producer"
)

// pageRead reads the rows of claim_page.sql.
type pageRead struct {
	s      *store
	topics []string
	share  int
	msgs   []producer.Message
	found  map[string]pageTopic
	// unreadable holds why each row of msgs that cannot be sent cannot
	// (readRow); nil when every row can.
	unreadable map[int64]string
	// tids holds where the claim locked each row of msgs, index for index:
	// the page's end moves a sent row from there (move_dispatched.sql).
	tids []pgtype.TID
}

func (s *store) pageRead(topics []string, share int) *pageRead {
	return &pageRead{s: s, topics: topics, share: share,
		msgs: make([]producer.Message, 0, share*len(topics)), found: make(map[string]pageTopic, len(topics)),
		tids: make([]pgtype.TID, 0, share*len(topics))}
}

// args are claim_page.sql's arguments.
func (r *pageRead) args(after []int64) []any {
	keys := make([]int64, len(r.topics))
	for i, t := range r.topics {
		keys[i] = r.s.table.TopicLockKey(t)
	}
	return []any{r.topics, after, keys, r.share, r.s.topicLocks, r.s.idleTimeout}
}

// scan reads the page's rows. Every column is scanned into what holds any
// value Postgres accepts (headers as bytes, timestamps with their
// infinities), so that no row's value can fail the page; readRow judges each
// row, and one it cannot send is kept in unreadable, to be dead-lettered as
// the page is sent (expireRows).
func (r *pageRead) scan(rows pgx.Rows) error {
	var (
		summary                               bool
		id, candidates, first                 *int64
		messageID, contentType, correlationID *string
		partitionKey                          *string
		headers                               []byte
		createdAt, expiresAt                  pgtype.Timestamptz
		attempts                              *int
		tid                                   pgtype.TID
		m                                     producer.Message
	)
	_, err := pgx.ForEachRow(rows, []any{&summary, &id, &messageID, &m.Topic, &m.Payload, &headers,
		&contentType, &correlationID, &partitionKey, &createdAt, &expiresAt, &attempts, &candidates, &first, &tid}, func() error {
		if summary {
			r.found[m.Topic] = pageTopic{candidates: int(*candidates), last: *id, first: *first}
		} else {
			m.ID, m.MessageID, m.Attempts = *id, *messageID, *attempts
			m.ContentType, m.CorrelationID, m.PartitionKey = deref(contentType), deref(correlationID), deref(partitionKey)
			if why := readRow(&m, headers, createdAt, expiresAt); why != "" {
				if r.unreadable == nil {
					r.unreadable = map[int64]string{}
				}
				r.unreadable[m.ID] = why
			}
			r.msgs = append(r.msgs, m)
			r.tids = append(r.tids, tid)
		}
		// Payload and Headers must not share memory with the next row.
		m, headers, createdAt, expiresAt = producer.Message{}, nil, pgtype.Timestamptz{}, pgtype.Timestamptz{}
		return nil
	})
	return err
}

func (r *pageRead) sorted() []producer.Message {
	if b := (byID{r.msgs, r.tids}); !sort.IsSorted(b) { // the TID scan reads them in the table's order, mostly theirs
		sort.Sort(b)
	}
	return r.msgs
}

// byID sorts claimed rows and their ctids together, by id.
type byID struct {
	msgs []producer.Message
	tids []pgtype.TID
}

func (b byID) Len() int           { return len(b.msgs) }
func (b byID) Less(i, j int) bool { return b.msgs[i].ID < b.msgs[j].ID }
func (b byID) Swap(i, j int) {
	b.msgs[i], b.msgs[j] = b.msgs[j], b.msgs[i]
	b.tids[i], b.tids[j] = b.tids[j], b.tids[i]
}

func (r *pageRead) failed(err error) error {
	return fmt.Errorf("claim a page of %d topics of %s: %w", len(r.topics), r.s.table, r.s.explain(err))
}

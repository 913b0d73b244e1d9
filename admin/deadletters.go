package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-sweeper/sweeper/outbox"
)

// filter reads the dead-letter filter from the query string: topic, reason,
// since (a duration), id (comma-separated).
func filterFromQuery(r *http.Request) (outbox.DeadLetterFilter, error) {
	q := r.URL.Query()
	f := outbox.DeadLetterFilter{Topic: q.Get("topic"), Reason: q.Get("reason")}
	if err := checkText("query parameter topic", f.Topic, filterHint); err != nil {
		return f, err
	}
	if err := checkText("query parameter reason", f.Reason, filterHint); err != nil {
		return f, err
	}
	if s := q.Get("since"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return f, fmt.Errorf("since=%s is not a duration like 24h", quoteShort(s))
		}
		f.Since = time.Now().Add(-d)
	}
	if s := q.Get("id"); s != "" {
		ids, err := parseIDs(s)
		if err != nil {
			return f, err
		}
		f.IDs = ids
	}
	return f, nil
}

// parseCursor reads the next_cursor of a previous page: the microseconds of
// its last row's dead_lettered_at and its id.
func parseCursor(s string) (*outbox.DeadLetterCursor, error) {
	// The id may be 0 or negative (a dead letter of reason invalid_id):
	// "123-0", "123--5".
	at, id, ok := strings.Cut(s, "-")
	micros, err1 := strconv.ParseInt(at, 10, 64)
	n, err2 := strconv.ParseInt(id, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return nil, fmt.Errorf("cursor=%s is not a next_cursor this API gave: pass the previous page's next_cursor as it is", quoteShort(s))
	}
	return &outbox.DeadLetterCursor{At: time.UnixMicro(micros), ID: n}, nil
}

func parseIDs(s string) ([]int64, error) {
	var ids []int64
	for _, p := range strings.Split(s, ",") {
		id, err := strconv.ParseInt(strings.TrimSpace(p), 10, 64)
		if err != nil { // 0 and below too: dead letters of reason invalid_id
			return nil, fmt.Errorf("id=%s: ids are whole numbers separated by commas", quoteShort(s))
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// maxPayloadPage bounds a page of dead letters with their payloads.
const maxPayloadPage = 100

func (a *api) dlqList(w http.ResponseWriter, r *http.Request) {
	f, err := filterFromQuery(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	limit := 50
	if s := r.URL.Query().Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > 10_000 {
			badRequest(w, "limit=%s: a whole number from 1 to 10000", quoteShort(s))
			return
		}
	}
	showPayload := r.URL.Query().Get("show_payload") == "true"
	if showPayload && limit > maxPayloadPage {
		// Payloads may be large, and the page is held whole to be encoded.
		badRequest(w, "limit=%d with show_payload=true: at most %d dead letters with their payloads a page; follow next_cursor for more", limit, maxPayloadPage)
		return
	}
	var after *outbox.DeadLetterCursor
	if c := r.URL.Query().Get("cursor"); c != "" {
		if after, err = parseCursor(c); err != nil {
			badRequest(w, "%v", err)
			return
		}
	}
	list, next, err := a.cfg.DeadLetters.ListPage(r.Context(), f, after, limit, showPayload)
	if err != nil {
		a.internal(w, r, err)
		return
	}
	if list == nil {
		list = []outbox.DeadLetter{}
	}
	out := map[string]any{"dead_letters": list}
	if next != nil {
		out["next_cursor"] = fmt.Sprintf("%d-%d", next.At.UnixMicro(), next.ID)
	}
	writeJSON(w, http.StatusOK, out)
}

// selection is the body of replay and purge.
type selection struct {
	IDs       []int64 `json:"ids"`
	Topic     string  `json:"topic"`
	Reason    string  `json:"reason"`
	Since     string  `json:"since"`      // replay: a duration
	OlderThan string  `json:"older_than"` // purge: a duration
	All       bool    `json:"all"`
	DryRun    bool    `json:"dry_run"` // count, change nothing
}

func decodeSelection(r *http.Request) (selection, outbox.DeadLetterFilter, error) {
	var s selection
	raw, err := readBody(r)
	if err != nil {
		return s, outbox.DeadLetterFilter{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return s, outbox.DeadLetterFilter{}, fmt.Errorf("body is not the JSON expected (ids, topic, reason, since, older_than, all, dry_run): %v", err)
	}
	f := outbox.DeadLetterFilter{IDs: s.IDs, Topic: s.Topic, Reason: s.Reason, All: s.All}
	// The JSON held UTF-8 (readBody saw to it), but an escape such as \u0000
	// still decodes to a NUL.
	if err := checkText("body field topic", f.Topic, filterHint); err != nil {
		return s, f, err
	}
	if err := checkText("body field reason", f.Reason, filterHint); err != nil {
		return s, f, err
	}
	for _, d := range []struct {
		name, v string
		set     func(time.Duration)
	}{{"since", s.Since, func(d time.Duration) { f.Since = time.Now().Add(-d) }}, {"older_than", s.OlderThan, func(d time.Duration) { f.Before = time.Now().Add(-d) }}} {
		if d.v == "" {
			continue
		}
		dur, err := time.ParseDuration(d.v)
		if err != nil {
			return s, f, fmt.Errorf("body field %s %s is not a duration like 720h", d.name, quoteShort(d.v))
		}
		if err := outbox.CheckAge("body field "+d.name, dur); err != nil {
			return s, f, err
		}
		d.set(dur)
	}
	return s, f, nil
}

// unboundedWrite lifts the server's write deadline (30 s) from a purge's or a
// replay's answer: one statement, all or nothing, that may run longer, and
// whose outcome the caller must learn (as Go's pprof handlers do for a
// profile).
func unboundedWrite(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
}

func (a *api) dlqReplay(w http.ResponseWriter, r *http.Request) {
	unboundedWrite(w)
	s, f, err := decodeSelection(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	if s.DryRun {
		// The number a confirmation shows: no lock is taken, so a replay
		// right after may move a few more or fewer.
		n, err := a.cfg.DeadLetters.Count(r.Context(), f)
		if errors.Is(err, outbox.ErrNoFilter) {
			badRequest(w, "%v", err)
			return
		}
		if err != nil {
			a.internal(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"replayed": n, "dry_run": true})
		return
	}
	n, err := a.cfg.DeadLetters.Replay(r.Context(), f)
	var missing *outbox.MissingDeadLettersError
	var conflict *outbox.ReplayConflictError
	switch {
	case errors.Is(err, outbox.ErrNoFilter), errors.As(err, &missing):
		badRequest(w, "%v", err)
	case errors.As(err, &conflict):
		// The outbox already holds a message id of the selection: nothing was
		// replayed, and the message says what to do.
		writeJSON(w, http.StatusConflict, errorBody{err.Error()})
	case err != nil:
		a.internal(w, r, err)
	default:
		a.audit(r, "dead letters replay", "count", n, "ids", f.IDs, "topic", f.Topic, "reason", f.Reason,
			"since", s.Since, "older_than", s.OlderThan, "all", f.All)
		writeJSON(w, http.StatusOK, map[string]any{"replayed": n, "dry_run": false})
	}
}

func (a *api) dlqPurge(w http.ResponseWriter, r *http.Request) {
	unboundedWrite(w)
	s, f, err := decodeSelection(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	if !f.Since.IsZero() {
		badRequest(w, "purge selects by age with older_than, not since (since would purge the newest)")
		return
	}
	n, err := a.cfg.DeadLetters.Purge(r.Context(), f, s.DryRun)
	switch {
	case errors.Is(err, outbox.ErrNoFilter):
		badRequest(w, "%v", err)
	case err != nil:
		a.internal(w, r, err)
	default:
		if !s.DryRun {
			a.audit(r, "dead letters purge", "count", n, "ids", f.IDs, "topic", f.Topic, "reason", f.Reason,
				"older_than", s.OlderThan, "all", f.All)
		}
		writeJSON(w, http.StatusOK, map[string]any{"purged": n, "dry_run": s.DryRun})
	}
}

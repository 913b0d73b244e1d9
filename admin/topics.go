package admin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/outbox"
)

func (a *api) tripped(w http.ResponseWriter, _ *http.Request) {
	list := a.cfg.Topics.Tripped()
	if list == nil {
		list = []breaker.TopicStatus{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tripped": list})
}

// backoffs lists the topics that failed transiently in a row, with when each is
// tried again and how long that is from now.
func (a *api) backoffs(w http.ResponseWriter, _ *http.Request) {
	type waiting struct {
		outbox.TopicBackoff
		WaitSeconds float64 `json:"wait_seconds"`
	}
	list := []waiting{}
	now := time.Now()
	for _, b := range a.cfg.Backoffs() {
		list = append(list, waiting{b, max(b.Until.Sub(now), 0).Seconds()})
	}
	writeJSON(w, http.StatusOK, map[string]any{"backoff": list})
}

func (a *api) trip(w http.ResponseWriter, r *http.Request) {
	topic, reason, err := readTopicCall(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	if reason == "" {
		reason = "tripped through the admin API"
	}
	before := a.cfg.Topics.State(topic)
	a.cfg.Topics.Trip(topic, reason)
	a.audit(r, "topic trip", "topic", topic, "reason", reason, "previous_state", before.String())
	a.topicChanged(w, topic, before)
}

func (a *api) reset(w http.ResponseWriter, r *http.Request) {
	topic, _, err := readTopicCall(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	before := a.cfg.Topics.State(topic)
	a.cfg.Topics.Reset(topic)
	a.audit(r, "topic reset", "topic", topic, "previous_state", before.String())
	a.topicChanged(w, topic, before)
}

// readTopicCall reads a topic trip's or reset's topic and reason. The topic
// is the path's (POST /topics/{topic}/trip) or, on POST /topics/trip and
// /topics/reset, the body's {"topic": "…"}: a browser, and curl, make "." and
// ".." path segments of a URL mean this folder and the one above, whatever
// their escaping, so those topics can only travel in a body.
func readTopicCall(r *http.Request) (topic, reason string, err error) {
	topic = r.PathValue("topic")
	if topic != "" {
		if err := checkText("topic", topic, topicHint); err != nil {
			return "", "", err
		}
	}
	var body struct {
		Reason string  `json:"reason"`
		Topic  *string `json:"topic"`
	}
	raw, err := readBody(r)
	if err != nil {
		return "", "", err
	}
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &body); err != nil {
			return "", "", fmt.Errorf("body is not JSON like {\"reason\": \"…\"}: %v", err)
		}
	}
	switch {
	case topic == "" && (body.Topic == nil || *body.Topic == ""):
		return "", "", fmt.Errorf("body field topic is missing or empty: %s %s takes {\"topic\": \"…\"}", r.Method, r.URL.Path)
	case topic == "":
		topic = *body.Topic
		if err := checkText("body field topic", topic, topicHint); err != nil {
			return "", "", err
		}
	case body.Topic != nil && *body.Topic != topic:
		return "", "", fmt.Errorf("body field topic %s is not the path's topic %s: give one", quoteShort(*body.Topic), quoteShort(topic))
	}
	if err := checkText("reason", body.Reason, "write it as UTF-8 text"); err != nil {
		return "", "", err
	}
	return topic, body.Reason, nil
}

// topicChanged answers a trip or reset with what it changed. Another
// instance's breaker (with Redis) may move the state between the two reads;
// the answer then shows both moves as one.
func (a *api) topicChanged(w http.ResponseWriter, topic string, before breaker.State) {
	writeJSON(w, http.StatusOK, map[string]string{"topic": topic, "state": a.cfg.Topics.State(topic).String(),
		"previous_state": before.String()})
}

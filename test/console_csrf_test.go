package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// attackPage is a page of another site that tries, from the operator's
// browser, what issue 30 reported: purge every dead letter and trip the
// broker breaker and a topic with no-cors fetches (which need no consent), the
// same with a JSON body (which needs a preflight), and read payloads. It sets
// its title to "done …" once every call has settled.
const attackPage = `<!doctype html><title>loading</title><script>
const t = %q;
const opts = (body, headers) => ({method: "POST", mode: "no-cors", body, headers: headers || {}});
const calls = [
  fetch(t + "/dlq/purge", opts('{"all":true}')),
  fetch(t + "/dlq/replay", opts('{"all":true}')),
  fetch(t + "/breaker/trip", opts('{"reason":"csrf"}')),
  fetch(t + "/topics/orders/trip", opts('{"reason":"csrf"}')),
  fetch(t + "/topics/trip", opts('{"topic":"orders"}', {"Content-Type": "text/plain"})),
  fetch(t + "/dlq/purge", {method: "POST", headers: {"Content-Type": "application/json"}, body: '{"all":true}'}),
  fetch(t + "/dlq?show_payload=true").then((r) => r.text()),
];
Promise.allSettled(calls).then((rs) => { document.title = "done " + rs.map((r) => r.status).join(","); });
</script>`

// With the default setup (loopback, no token), a page of another site opened
// in the operator's browser changes nothing: no dead letter purged or
// replayed, no breaker tripped. A Host naming another site is refused, reads
// included (DNS rebinding). The console, served by the API itself, still
// acts: it lists and purges the dead letters of topic " x " only (not
// those of "x"), and trips and resets the topic ".".
func TestConsoleRefusesOtherSitesAndStillActs(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)

	tbl := migrated(t)
	ctx := context.Background()
	prod := memory.New(memory.Config{})
	for _, m := range []outbox.Message{{Topic: "x"}, {Topic: "x"}, {Topic: " x "}, {Topic: "orders"}} {
		m.Payload = []byte("SECRET")
		prod.FailMessage(writeOne(t, tbl, m), producer.NewMessageError(producer.ReasonInvalidMessage, nil, errors.New("refused by the test")))
	}
	s, err := outbox.NewSweeper(dbtest.Pool(t), prod, outbox.Config{Table: tbl})
	require.NoError(t, err)
	_, err = s.Sweep(ctx)
	require.NoError(t, err)
	deadByTopic := func() map[string]int {
		rows, err := dbtest.Pool(t).Query(ctx, "SELECT topic, count(*) FROM "+tbl.Schema+"."+tbl.DeadLetterName()+" GROUP BY topic")
		require.NoError(t, err)
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var topic string
			var n int
			require.NoError(t, rows.Scan(&topic, &n))
			out[topic] = n
		}
		require.NoError(t, rows.Err())
		return out
	}
	require.Equal(t, map[string]int{"x": 2, " x ": 1, "orders": 1}, deadByTopic())

	// The default: loopback, no token.
	port := dbtest.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p := start(t, []string{"OUTBOX_ADMIN_ADDR=" + addr}, "run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema, "--tick", "200ms",
		"--topic-cooldown-ticks", "100000", "--topic-cooldown-max-ticks", "100000")
	base := "http://" + addr
	get := func(path, host string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		require.NoError(t, err)
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	dbtest.Eventually(t, 2*time.Minute, "ready", func() bool { code, _ := get("/readyz", ""); return code == 200 })

	// DNS rebinding: the browser would send the attacker's name as Host.
	code, body := get("/dlq?show_payload=true", fmt.Sprintf("attacker.example:%d", port))
	require.Equal(t, http.StatusForbidden, code, body)
	require.NotContains(t, body, "SECRET")
	require.Contains(t, body, "does not name this API")

	// The attacker's site: another origin (another port of this host).
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, attackPage, base)
	}))
	defer attacker.Close()

	browser := newBrowser(t, chromium)
	step := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(browser, 2*time.Minute)
		defer cancel()
		require.NoError(t, chromedp.Do(sctx, actions...), "%s; sweeper stderr:\n%s", what, p.Stderr())
	}
	js := func(expr string) chromedp.Action[chromedp.Void] { return chromedp.Evaluate[chromedp.Void](expr) }

	// The no-cors calls were answered (opaquely: the answers are refusals);
	// the preflighted one and the read were stopped by the browser.
	step("the attacker's page runs its calls to the end", chromedp.Navigate(attacker.URL+"/"), until(`document.title.startsWith("done")`),
		until(`document.title === "done fulfilled,fulfilled,fulfilled,fulfilled,fulfilled,rejected,rejected"`))

	require.Equal(t, map[string]int{"x": 2, " x ": 1, "orders": 1}, deadByTopic(), "nothing purged or replayed")
	code, body = get("/breaker", "")
	require.Equal(t, 200, code, body)
	var br struct {
		State         string `json:"state"`
		TrippedByHand string `json:"tripped_by_hand"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &br))
	require.Equal(t, "closed", br.State, body)
	require.Empty(t, br.TrippedByHand)
	code, body = get("/topics/tripped", "")
	require.Equal(t, 200, code, body)
	require.JSONEq(t, `{"tripped":[]}`, body, "no topic tripped")
	require.Contains(t, p.Stderr(), "admin API request refused")

	// The console, from the API's own origin, still acts.
	group := `Array.from(document.querySelectorAll("#dead-groups tr")).find(tr => tr.querySelector("td.topic").textContent === " x ")`
	row := func(topic string) string {
		return fmt.Sprintf(`Array.from(document.querySelectorAll("#topics tr")).find(tr => tr.querySelector("td.topic").textContent === %q)`, topic)
	}
	message := func(text string) chromedp.Action[chromedp.Void] {
		return until(fmt.Sprintf(`document.getElementById("message").textContent.includes(%q)`, text))
	}
	step("list the group of topic \" x \": its one letter, not those of \"x\"",
		chromedp.Navigate(base+"/"), until(group+` !== undefined`),
		js(group+`.querySelector("button").click()`),
		until(`document.getElementById("f-topic").value === " x "`),
		until(`(() => { const rs = Array.from(document.querySelectorAll("#dead-letters tr")); `+
			`return rs.length === 1 && rs[0].querySelector("td.topic").textContent === " x "; })()`))
	step("purge what the filter matches: the question counts 1, and names the topic quoted",
		chromedp.Click("#dlq-purge-matching"),
		until(`!document.getElementById("ask").hidden && document.getElementById("ask-text").textContent.includes('Delete 1 dead letters (the dead letters matching topic " x "')`),
		chromedp.Click("#ask-ok"), message("1 dead letters purged"))
	require.Equal(t, map[string]int{"x": 2, "orders": 1}, deadByTopic(), "only the letter of topic \" x \" purged")

	step("trip the topic \".\" from the page",
		chromedp.SetValue("#trip-topic", "."), chromedp.Click(`#trip-form button[type="submit"]`),
		until(`!document.getElementById("ask").hidden && document.getElementById("ask-text").textContent.includes("Trip topic .?")`),
		chromedp.Click("#ask-ok"), message("topic . was closed, is tripped"),
		until(row(".")+` !== undefined && `+row(".")+`.querySelector("button").textContent === "Reset"`))
	code, body = get("/topics/tripped", "")
	require.Equal(t, 200, code)
	require.Contains(t, body, `"topic":"."`)
	step("reset it from the page", js(row(".")+`.querySelector("button").click()`),
		until(`!document.getElementById("ask").hidden && document.getElementById("ask-text").textContent.includes("Reset topic .?")`),
		chromedp.Click("#ask-ok"), message("topic . was tripped, is closed"))
	code, body = get("/topics/tripped", "")
	require.Equal(t, 200, code)
	require.False(t, strings.Contains(body, `"topic":"."`), body)
}

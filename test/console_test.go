package test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// chromiumPath returns Debian's chromium, which the browser tests drive.
func chromiumPath(t *testing.T) string {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	require.NoError(t, err, "Debian's chromium runs the console's browser test; .ci/run installs it (apt-get install chromium)")
	return chromium
}

// newBrowser starts chromium headless and returns its tab's context; it
// closes when the test ends. The browser starts here, under that context:
// started by a step's, whose timeout is shorter, it would close with it.
func newBrowser(t *testing.T, chromium string) context.Context {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1280, 900))...)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	require.NoError(t, chromedp.Do(browser))
	return browser
}

// until polls the page until expr holds, for up to 2 minutes. Its error
// names expr: a step of several polls then says which one did not hold.
func until(expr string) chromedp.Action[chromedp.Void] {
	poll := chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(2*time.Minute))
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		v, err := poll(ctx, t)
		if err != nil {
			return v, fmt.Errorf("waiting for %s: %w", expr, err)
		}
		return v, nil
	}
}

// postAdmin posts body to the admin API at url with the tests' token, and
// requires a 200.
func postAdmin(t *testing.T, url, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer t0ken")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
}

// The console in a real browser (Debian's headless Chromium, driven with
// chromedp) against the binary: sign in, see a tripped topic whose name is an
// HTML tag rendered as text (no dialog ever opens), reset it from the page
// and see it close, trip another with a reason, read a dead letter's payload
// (fetched only on request), replay a dead letter from the page and see it
// leave the list, replay all that a filter matches after a confirmation that
// says how many, and read it all on a phone's width with nothing cut or
// scrolled sideways. Screenshots go to OUTBOX_TEST_SCREENSHOTS when it names
// a directory.
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)

	tbl := migrated(t)
	// Dead letters: rows a library sweeper's producer refuses.
	ctx := context.Background()
	deadID := writeOne(t, tbl, outbox.Message{Topic: "invoices", Payload: []byte("refused"), CorrelationID: "corr-dead-1"})
	pay1 := writeOne(t, tbl, outbox.Message{Topic: "payments", Payload: []byte(`{"amount":42,"note":"<script>alert(2)</script>"}`)})
	pay2 := writeOne(t, tbl, outbox.Message{Topic: "payments", Payload: []byte(`{"amount":43}`)})
	prod := memory.New(memory.Config{})
	for _, id := range []int64{deadID, pay1, pay2} {
		prod.FailMessage(id, producer.NewMessageError(producer.ReasonInvalidMessage, nil, errors.New("refused by the test")))
	}
	s, err := outbox.NewSweeper(dbtest.Pool(t), prod, outbox.Config{Table: tbl})
	require.NoError(t, err)
	_, err = s.Sweep(ctx)
	require.NoError(t, err)
	require.Len(t, deadLetterReasons(t, tbl), 3)

	p, base := startWithAdmin(t, tbl, "--tick", "200ms",
		// A tripped topic stays tripped until reset, however slow the browser.
		"--topic-cooldown-ticks", "100000", "--topic-cooldown-max-ticks", "100000")
	const xss = `<img src=x onerror=alert(1)>`
	postAdmin(t, base+"/topics/"+url.PathEscape(xss)+"/trip", `{"reason":"<b>not bold</b>"}`)
	writeOne(t, tbl, outbox.Message{Topic: xss, Payload: []byte("x")})

	browser := newBrowser(t, chromium)
	var dialogs atomic.Int32
	require.NoError(t, chromedp.Listen(browser, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
		}
	}))
	step := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(browser, 2*time.Minute)
		defer cancel()
		err := chromedp.Do(sctx, actions...)
		if err != nil {
			dctx, dcancel := context.WithTimeout(browser, 10*time.Second)
			html, derr := chromedp.Run(dctx, chromedp.Evaluate[string](`"signin hidden=" + document.getElementById("signin").hidden + " console hidden=" + document.getElementById("console").hidden + " msg=" + document.getElementById("message").textContent + " ask=" + document.getElementById("ask-text").textContent + " err=" + document.getElementById("signin-error").textContent + " rows=" + document.querySelectorAll("#topics tr").length + " letters=" + document.querySelectorAll("#dead-letters tr").length`))
			dcancel()
			t.Logf("the page when %q failed (%v): %s", what, derr, html)
		}
		require.NoError(t, err, "%s (dialogs opened: %d); sweeper stderr:\n%s", what, dialogs.Load(), p.Stderr())
	}
	js := func(expr string) chromedp.Action[chromedp.Void] { return chromedp.Evaluate[chromedp.Void](expr) }
	shot := func(name string) {
		dir := os.Getenv("OUTBOX_TEST_SCREENSHOTS")
		if dir == "" {
			return
		}
		sctx, cancel := context.WithTimeout(browser, time.Minute)
		defer cancel()
		png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
	}
	// row finds the topics table's row of a topic, by its text.
	row := func(topic string) string {
		return fmt.Sprintf(`Array.from(document.querySelectorAll("#topics tr")).find(tr => tr.querySelector("td.topic").textContent === %q)`, topic)
	}
	message := func(text string) chromedp.Action[chromedp.Void] {
		return until(fmt.Sprintf(`document.getElementById("message").textContent.includes(%q)`, text))
	}

	step("sign in", chromedp.Navigate(base+"/"), chromedp.WaitVisible("#signin-form"),
		chromedp.SendKeys("#token", "t0ken"), chromedp.Click(`#signin-form button[type="submit"]`),
		until(row(xss)+` !== undefined`),
		until(fmt.Sprintf(`document.querySelector('input.pick[value="%d"]') !== null`, pay1)))
	shot("console.png")
	step("the tripped topic, its name and reason as text",
		until(row(xss)+`.querySelector("td.state").textContent.startsWith("tripped")`),
		until(row(xss)+`.querySelector("td.error-text").textContent === "<b>not bold</b>"`),
		until(`document.querySelectorAll("img, b").length === 0`),
		until(`document.getElementById("health-state").textContent === "degraded" && document.getElementById("health-reasons").textContent.includes("1 topics tripped or half-open")`))

	step("reset it from the page, after a question that names it", until(row(xss)+`.querySelector("button").textContent === "Reset"`),
		js(row(xss)+`.querySelector("button").click()`),
		until(fmt.Sprintf(`!document.getElementById("ask").hidden && document.getElementById("ask-text").textContent.startsWith(%q)`, "Reset topic "+xss)),
		chromedp.Click("#ask-ok"),
		message("was tripped, is closed"),
		// Closed, its row is sent by the sweeper, and the topic shows what
		// was sent in the last minute.
		until(`(() => { const r = `+row(xss)+`; return r !== undefined && r.querySelector("td.state").textContent.startsWith("closed") && r.querySelector('td[data-label="Sent, last min"]').textContent === "1"; })()`),
		until(`document.getElementById("health-state").textContent === "ok"`))

	step("trip a topic from the page, with a reason asked in the page",
		chromedp.SetValue("#trip-topic", "shipping"), chromedp.Click(`#trip-form button[type="submit"]`),
		until(`!document.getElementById("ask").hidden && document.getElementById("ask-text").textContent.includes("Trip topic shipping?")`),
		chromedp.SendKeys("#ask-reason", "warehouse migration"), chromedp.Click("#ask-ok"),
		message("topic shipping was closed, is tripped"),
		until(row("shipping")+` !== undefined && `+row("shipping")+`.querySelector("td.error-text").textContent === "warehouse migration"`))

	payBtn := fmt.Sprintf(`document.querySelector('#dead-letters tr[data-id="%d"] button')`, pay1)
	step("a payload is shown only on request, as text",
		until(`!document.body.textContent.includes('"amount":42')`),
		until(payBtn+` !== null`), js(payBtn+`.click()`),
		until(`(() => { const p = document.querySelector("pre.payload"); return p !== null && p.textContent.includes('{"amount":42,"note":"<script>alert(2)</script>"}'); })()`),
		until(`document.querySelectorAll("#dead-letters script").length === 0`))

	pick := fmt.Sprintf(`document.querySelector('input.pick[value="%d"]')`, deadID)
	step("replay the dead letter from the page", until(pick+` !== null`),
		js(pick+`.click()`),
		chromedp.Click("#dlq-replay"),
		until(pick+` === null`),
		message("1 dead letters replayed"))
	shot("console-after.png")

	step("replay all that a filter matches, after a confirmation that counts them",
		chromedp.SetValue("#f-topic", "payments"), chromedp.Click(`#dlq-filter button[type="submit"]`),
		chromedp.Click("#dlq-replay-matching"),
		until(`!document.getElementById("ask").hidden && document.getElementById("ask-text").textContent.includes("Replay 2 dead letters (the dead letters matching topic payments)")`),
		chromedp.Click("#ask-ok"),
		message("2 dead letters replayed"),
		until(`document.querySelectorAll("#dead-letters tr").length === 0`))

	step("a phone's width: rows become cards, nothing scrolls sideways",
		chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile),
		until(`document.querySelector("thead").offsetParent === null`), // headers hidden, cells labelled
		until(row("shipping")+`.querySelector("td.state").getBoundingClientRect().right <= window.innerWidth`),
		until(`document.documentElement.scrollWidth <= window.innerWidth`))
	shot("console-phone.png")

	require.Zero(t, dialogs.Load(), "no dialog opened: neither the topic's tag nor the payload's script ran, and the page asks in the page")
	dbtest.Eventually(t, time.Minute, "the replayed rows sent", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	require.Empty(t, deadLetterReasons(t, tbl))
}

// The console of a relay of many outboxes, in a real browser: the list of
// tenants at /, the one with a tripped topic first and its topic's name as
// text, and its link to the tenant's own console, which works under
// /outboxes/{schema}/ (its files and calls relative to it).
func TestFleetConsoleInABrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	base := dbtest.Schema(t)
	var tbls []outbox.Table
	for i := range 3 {
		tbl := outbox.Table{Schema: fmt.Sprintf("%s_t%d", base, i), Name: "outbox"}
		code, out, errOut := runOnce(t, "migrate", "--database-url", dbtest.URL(t), "--schema", tbl.Schema)
		require.Equal(t, 0, code, "%s%s", out, errOut)
		t.Cleanup(func() {
			_, _ = dbtest.Pool(t).Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{tbl.Schema}.Sanitize()+" CASCADE")
		})
		tbls = append(tbls, tbl)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	p := start(t, []string{"OUTBOX_ADMIN_ADDR=" + addr, "OUTBOX_ADMIN_TOKEN=t0ken"}, "run", "--database-url", dbtest.URL(t),
		"--schemas", base+"_t*", "--topic-cooldown-ticks", "100000", "--topic-cooldown-max-ticks", "100000")
	dbtest.Eventually(t, 2*time.Minute, "every tenant relayed", func() bool {
		return strings.Contains(p.Stderr(), "relaying outboxes outboxes=3")
	})
	const xss = `<img src=x onerror=alert(1)>`
	troubled := tbls[1]
	postAdmin(t, "http://"+addr+"/outboxes/"+troubled.Schema+"/topics/"+url.PathEscape(xss)+"/trip", `{"reason":"by the test"}`)

	browser := newBrowser(t, chromium)
	step := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(browser, 3*time.Minute)
		defer cancel()
		require.NoError(t, chromedp.Do(sctx, actions...), "%s; relay stderr:\n%s", what, p.Stderr())
	}
	step("sign in to the list of outboxes", chromedp.Navigate("http://"+addr+"/"), chromedp.WaitVisible("#signin-form"),
		chromedp.SendKeys("#token", "t0ken"), chromedp.Click(`#signin-form button[type="submit"]`),
		until(`document.querySelectorAll("#outboxes tr").length === 3`),
		until(fmt.Sprintf(`document.querySelector("#outboxes tr td a").textContent === %q`, troubled.Schema)),
		until(fmt.Sprintf(`document.querySelector("#outboxes tr").cells[5].textContent === %q`, xss)),
		until(`document.querySelectorAll("#outboxes img").length === 0`),
		until(fmt.Sprintf(`document.querySelector("#outboxes tr td a").href === %q`, "http://"+addr+"/outboxes/"+troubled.Schema+"/")))
	// The link is followed as the browser would, by its address: a click
	// navigates away under chromedp's running action.
	step("the tenant's own console, at the link's address",
		chromedp.Navigate("http://"+addr+"/outboxes/"+troubled.Schema+"/"),
		until(fmt.Sprintf(`Array.from(document.querySelectorAll("#topics tr td.topic")).some(td => td.textContent === %q)`, xss)),
		until(`document.getElementById("health-state").textContent === "degraded"`),
		// Named, so that an operator with several tenants' consoles open
		// acts on the one meant; its questions name it too.
		until(fmt.Sprintf(`document.querySelector("h1").textContent === %q && document.title === %q`,
			"outbox sweeper: "+troubled.Schema, "outbox sweeper: "+troubled.Schema)))
}

// heldListing wraps the page's fetch before the console's script runs: the
// unfiltered listing of dead letters (the one the page starts on load) is
// answered only once a filtered listing's answer has been shown, and sets
// window.staleAnswered once the console has had it. Answers that come back
// out of order, made to happen every time.
const heldListing = `(() => {
  const realFetch = window.fetch;
  let filteredShown;
  const filtered = new Promise((resolve) => { filteredShown = resolve; });
  window.fetch = async (url, opts) => {
    const resp = await realFetch(url, opts);
    if (!new URL(url, location.href).pathname.endsWith("/dlq")) return resp;
    const data = await resp.json();
    // after runs once the console's code after its await has run: a task
    // queued behind it.
    const answer = (after) => ({ status: resp.status, ok: resp.ok, statusText: resp.statusText,
      json: async () => { setTimeout(after, 0); return data; } });
    if (new URL(url, location.href).searchParams.has("topic")) return answer(filteredShown);
    await filtered;
    return answer(() => { window.staleAnswered = true; });
  };
})();`

// A group's List clicked while the page's first listing is still in flight
// shows that group's dead letters, and keeps showing them when the first
// listing's answer comes back after: an earlier answer is stale. (It once
// came back last now and then, and the console listed every dead letter
// under a filter naming one topic.)
func TestConsoleShowsTheListingLastAskedFor(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)

	tbl := migrated(t)
	prod := memory.New(memory.Config{})
	for _, topic := range []string{"a", "b", "b"} {
		prod.FailMessage(writeOne(t, tbl, outbox.Message{Topic: topic, Payload: []byte("x")}),
			producer.NewMessageError(producer.ReasonInvalidMessage, nil, errors.New("refused by the test")))
	}
	s, err := outbox.NewSweeper(dbtest.Pool(t), prod, outbox.Config{Table: tbl})
	require.NoError(t, err)
	_, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Len(t, deadLetterReasons(t, tbl), 3)

	// Loopback and no token: the console opens without signing in, and
	// lists the dead letters at once.
	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	p := start(t, []string{"OUTBOX_ADMIN_ADDR=" + addr}, "run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema)
	base := "http://" + addr
	dbtest.Eventually(t, 2*time.Minute, "ready", func() bool { return readyz(addr) == http.StatusOK })

	browser := newBrowser(t, chromium)
	group := `Array.from(document.querySelectorAll("#dead-groups tr")).find(tr => tr.querySelector("td.topic").textContent === "a")`
	letters := `Array.from(document.querySelectorAll("#dead-letters tr")).map(tr => tr.querySelector("td.topic").textContent).join(",")`
	ctx, cancel := context.WithTimeout(browser, 3*time.Minute)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
			_, err := cdp.Call(ctx, tgt, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: heldListing})
			return err
		}),
		chromedp.Navigate(base+"/"), until(group+` !== undefined`),
		chromedp.Evaluate[chromedp.Void](group+`.querySelector("button").click()`),
		until(`window.staleAnswered === true`),
	), "sweeper stderr:\n%s", p.Stderr())
	shown, err := chromedp.Run(ctx, chromedp.Evaluate[string](letters))
	require.NoError(t, err)
	require.Equal(t, "a", shown, "the listing of topic a, which the filter names, not the page's first listing of every topic")
	topic, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("f-topic").value`))
	require.NoError(t, err)
	require.Equal(t, "a", topic)
}

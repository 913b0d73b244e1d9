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

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// The console in a real browser (Debian's headless Chromium, driven with
// chromedp) against the binary: sign in, see a tripped topic whose name is an
// HTML tag rendered as text (no dialog ever opens), reset it from the page
// and see it close, replay a dead letter from the page and see it leave the
// list. Screenshots go to OUTBOX_TEST_SCREENSHOTS when it names a directory.
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	chromium, err := exec.LookPath("chromium")
	require.NoError(t, err, "Debian's chromium runs the console's browser test; .ci/run installs it (apt-get install chromium)")

	tbl := migrated(t)
	// A dead letter: a row a library sweeper's producer refuses.
	ctx := context.Background()
	deadID := writeOne(t, tbl, outbox.Message{Topic: "invoices", Payload: []byte("refused"), CorrelationID: "corr-dead-1"})
	prod := memory.New(memory.Config{})
	prod.FailMessage(deadID, producer.NewMessageError(producer.ReasonInvalidMessage, nil, errors.New("refused by the test")))
	s, err := outbox.NewSweeper(dbtest.Pool(t), prod, outbox.Config{Table: tbl})
	require.NoError(t, err)
	_, err = s.Sweep(ctx)
	require.NoError(t, err)
	require.Contains(t, deadLetterReasons(t, tbl), deadID)

	p, base := startWithAdmin(t, tbl, "--tick", "200ms",
		// A tripped topic stays tripped until reset, however slow the browser.
		"--topic-cooldown-ticks", "100000", "--topic-cooldown-max-ticks", "100000")
	const xss = `<img src=x onerror=alert(1)>`
	req, err := http.NewRequest(http.MethodPost, base+"/topics/"+url.PathEscape(xss)+"/trip", strings.NewReader(`{"reason":"<b>not bold</b>"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer t0ken")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	writeOne(t, tbl, outbox.Message{Topic: xss, Payload: []byte("x")})

	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1280, 900))...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(alloc)
	defer cancelBrowser()
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
			html, derr := chromedp.Run(dctx, chromedp.Evaluate[string](`"signin hidden=" + document.getElementById("signin").hidden + " console hidden=" + document.getElementById("console").hidden + " msg=" + document.getElementById("message").textContent + " err=" + document.getElementById("signin-error").textContent + " token=" + sessionStorage.getItem("outbox-admin-token") + " rows=" + document.querySelectorAll("#topics tr").length`))
			dcancel()
			t.Logf("the page when %q failed (%v): %s", what, derr, html)
		}
		require.NoError(t, err, "%s (dialogs opened: %d); sweeper stderr:\n%s", what, dialogs.Load(), p.Stderr())
	}
	wait := func(expr string) chromedp.Action[chromedp.Void] {
		return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(2*time.Minute))
	}
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

	step("sign in", chromedp.Navigate(base+"/"), chromedp.WaitVisible("#signin-form"),
		chromedp.SendKeys("#token", "t0ken"), chromedp.Click(`#signin-form button[type="submit"]`),
		wait(row(xss)+` !== undefined`))
	shot("console.png")
	step("the tripped topic, its name and reason as text",
		wait(row(xss)+`.querySelector("td.state").textContent.startsWith("tripped")`),
		wait(row(xss)+`.querySelector("td.error-text").textContent === "<b>not bold</b>"`),
		wait(`document.querySelectorAll("img, b").length === 0`))

	step("reset it from the page", wait(row(xss)+`.querySelector("button").textContent === "Reset"`),
		chromedp.Evaluate[chromedp.Void](row(xss)+`.querySelector("button").click()`),
		// Closed, its row is sent by the sweeper and leaves the list.
		wait(`(() => { const r = `+row(xss)+`; return r === undefined || r.querySelector("td.state").textContent.startsWith("closed"); })()`))

	pick := fmt.Sprintf(`document.querySelector('input.pick[value="%d"]')`, deadID)
	step("replay the dead letter from the page", wait(pick+` !== null`),
		chromedp.Evaluate[chromedp.Void](pick+`.click()`),
		chromedp.Click("#dlq-replay"),
		wait(pick+` === null`),
		wait(`document.getElementById("message").textContent.includes("1 dead letters replayed")`))
	shot("console-after.png")
	require.Zero(t, dialogs.Load(), "no dialog opened: the topic's tag never ran")
	dbtest.Eventually(t, time.Minute, "the replayed row sent", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	require.Empty(t, deadLetterReasons(t, tbl))
}

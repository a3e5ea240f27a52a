package main

import (
	"bufio"
	"context"
	"flag"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

var screenshot = flag.String("screenshot", "", "write the browser test's screenshot of the page here (the README's is docs/serve.png)")

// chromium finds a Chromium or Chrome binary, or skips the test.
func chromium(t *testing.T) string {
	if p := os.Getenv("KAFKAONCE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no Chromium found (apt-get install chromium, or set KAFKAONCE_CHROMIUM): the page's browser test does not run")
	return ""
}

// serve runs kafkaonce serve, as a user would start it, until the test
// ends, and returns the URL it printed.
func (w *world) serve(args ...string) string {
	w.t.Helper()
	r, out := io.Pipe()
	env := w.env()
	st := streams{in: strings.NewReader(""), out: out, err: io.Discard, terminal: func() bool { return false }, getenv: func(k string) string { return env[k] }}
	root := newRoot(st)
	root.SetArgs(append([]string{"--schema", w.db.Schema, "serve"}, args...))
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		err := root.ExecuteContext(ctx)
		out.CloseWithError(io.EOF)
		done <- err
	}()
	w.t.Cleanup(func() {
		cancel()
		require.NoError(w.t, <-done)
	})
	line, err := bufio.NewReader(r).ReadString('\n')
	require.NoError(w.t, err, "serve did not start")
	go func() { _, _ = io.Copy(io.Discard, r) }()
	_, rest, ok := strings.Cut(line, "serving on ")
	require.True(w.t, ok, line)
	addr, _, _ := strings.Cut(rest, " ")
	return addr
}

// A real consumer set two messages aside; its handler is fixed. In a real
// browser an operator opens the page, opens the letter (whose value holds
// markup, shown as text), presses redrive and confirms, and sees the letter
// settle, its effect applied once. Then they pause the partition, with a
// reason, and the running consumer takes nothing from it until they resume
// it from the page.
func TestServeInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	bin := chromium(t)
	w := newPoisoned(t)
	w.fixed.Store(true)
	c, err := consumer.New(w.db.Pool, &consumer.Config{Name: w.name, Brokers: w.kafka.Brokers, Topics: []string{w.topic},
		Schema: w.db.Schema, Handler: w.handler, SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	runCtx, stopConsumer := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(runCtx) }()
	defer func() { stopConsumer(); require.NoError(t, <-stopped) }()
	for w.minPosition() < 6 { // late5 too
		time.Sleep(50 * time.Millisecond)
	}
	parked := w.park()
	base := w.serve("--listen", "127.0.0.1:0", "--allow-actions")

	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 1000),
		chromedp.UserDataDir(t.TempDir()))...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	ctx, timeout := context.WithTimeout(ctx, 90*time.Second)
	defer timeout()
	var mu sync.Mutex
	var dialogs []string
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		if d, ok := ev.(*cdppage.EventJavascriptDialogOpening); ok {
			mu.Lock()
			dialogs = append(dialogs, d.Message)
			mu.Unlock()
		}
	}))
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return v
	}

	// The overview: the consumer, its lag, the letters by class.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("table.letters"))))
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	path := *screenshot
	if path == "" {
		path = filepath.Join(t.TempDir(), "serve.png")
	}
	require.NoError(t, os.WriteFile(path, shot, 0o644))
	t.Logf("screenshot: %s", path)
	// The page uses the window's width, and no cell's content runs out of
	// its cell.
	wide, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`document.querySelector("main").getBoundingClientRect().width / window.innerWidth`))
	require.NoError(t, err)
	require.Greater(t, wide, 0.95, "the page's content leaves the window's width unused")
	overflowing, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("td, th")].filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.textContent.slice(0, 40))`))
	require.NoError(t, err)
	require.Empty(t, overflowing, "cells whose content overflows them")
	body := text("body")
	require.Contains(t, body, w.name)
	require.Contains(t, body, "lag 0")
	require.Contains(t, body, "permanent")
	require.Contains(t, body, parked, "the parked outbox row")
	bad1 := strconv.FormatInt(w.letterID("bad1"), 10)
	require.Contains(t, body, w.topic+"/0/1", "the letter of bad1, at offset 1")

	// The letter: its value, markup and all, is text.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`a[href="/letters/`+bad1+`"]`)), chromedp.WaitVisible(chromedp.CSS("pre.value"))))
	require.Equal(t, scriptValue, text("pre.value"))
	require.Equal(t, "pending", text("dd.state"))

	// Redrive, confirmed.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`a.action[href$="/redrive"]`)), chromedp.WaitVisible(chromedp.CSS("button.confirm"))))
	require.Equal(t, "Redrive dead letter "+bad1+"?", text("h1"))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("button.confirm")), chromedp.WaitVisible(chromedp.CSS("p.notice"))))
	require.Contains(t, text("p.notice"), "Redrive requested")

	// The running consumer performs it within seconds; the page shows it.
	deadline := time.Now().Add(30 * time.Second)
	for state := text("dd.state"); !strings.HasPrefix(state, "redriven"); state = text("dd.state") {
		require.True(t, time.Now().Before(deadline), "the letter did not settle: %s", state)
		time.Sleep(500 * time.Millisecond)
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/letters/"+bad1)))
	}
	actions, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("a.action").length`))
	require.NoError(t, err)
	require.Zero(t, actions, "a redriven letter offers no action")
	mu.Lock()
	require.Empty(t, dialogs, "no script of a message ran")
	mu.Unlock()

	require.EqualValues(t, 1, w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("effects")+` WHERE message_id = 'bad1'`), "applied once")
	require.Zero(t, w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("effects")+` WHERE message_id = 'bad3'`), "the other letter waits")
	w.requireEffectsOnce(5) // ok0 ok2 ok4 late5 bad1

	// Pause the partition from the overview, with a reason: the running
	// consumer takes nothing more from it, and the page says who paused
	// it and why.
	pauseLink := `a.action[href="/consumers/` + w.name + `/pause?topic=` + w.topic + `&partition=0"]`
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/"), chromedp.Click(chromedp.CSS(pauseLink)),
		chromedp.WaitVisible(chromedp.CSS(`input[name="reason"]`))))
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(`input[name="reason"]`), "partner <down>"),
		chromedp.Click(chromedp.CSS("button.confirm")), chromedp.WaitVisible(chromedp.CSS("p.notice"))))
	require.Contains(t, text("p.notice"), "Paused")
	paused := text("div.paused")
	require.Contains(t, paused, w.topic+"/0 paused")
	require.Contains(t, paused, "partner <down>", "the reason, as text")
	require.Contains(t, paused, "by kafkaonce serve, from 127.0.0.1:")
	waitUntil(t, 30*time.Second, "the running consumer paused", func() bool { return c.Health(context.Background()).Paused == 1 })
	w.kafka.Produce(t, w.topic, kafka.Message{Key: []byte("paused6"), Value: []byte("fine"),
		Headers: []kafka.Header{{Key: "message-id", Value: []byte("paused6")}}})
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		require.EqualValues(t, 6, w.position(0), "a paused partition moved")
	}

	// Resume it from the page: the message produced meanwhile is applied,
	// once.
	resumeLink := `a.action[href="/consumers/` + w.name + `/resume?topic=` + w.topic + `&partition=0"]`
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(resumeLink)), chromedp.WaitVisible(chromedp.CSS("button.confirm"))))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("button.confirm")), chromedp.WaitVisible(chromedp.CSS("p.notice"))))
	require.Contains(t, text("p.notice"), "Resumed")
	waitUntil(t, 30*time.Second, "the partition past paused6", func() bool { return w.position(0) == 7 })
	w.requireEffectsOnce(6)
	gone, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("div.paused").length`))
	require.NoError(t, err)
	require.Zero(t, gone, "the page still shows the pause")
}

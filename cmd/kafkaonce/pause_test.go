package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// runConsumer runs w's consumer (one effect row per message) until the
// test ends.
func (w *world) runConsumer() {
	w.t.Helper()
	cfg := w.consumerConfig()
	c, err := consumer.New(w.db.Pool, cfg)
	require.NoError(w.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	w.t.Cleanup(func() {
		cancel()
		require.NoError(w.t, <-done)
	})
}

func (w *world) position(partition int) int64 {
	return w.db.Int(w.t, `SELECT coalesce(max(next_offset), -1) FROM `+w.db.Table("consumer_offsets")+` WHERE consumer = $1 AND partition = $2`, w.name, partition)
}

func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.produce(40, "m")

	t.Run("a pause from the CLI holds a running consumer's partition until resume", func(t *testing.T) {
		_, errOut, code := w.cli("pause", "--consumer", w.name, "--topic", w.topic, "--partition", "1", "--reason", "inspecting")
		require.Equal(t, 2, code, "a consumer that never started: a mistyped name?")
		require.Contains(t, errOut, "pass --unrecorded to pause a consumer before its first start")
		out, errOut, code := w.cli("pause", "--consumer", w.name, "--unrecorded", "--topic", w.topic, "--partition", "1", "--reason", "inspecting")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "paused "+w.topic+"/1 of consumer "+w.name)
		w.runConsumer()
		waitUntil(t, time.Minute, "partition 0 processed", func() bool { return w.position(0) == 20 })
		for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			require.LessOrEqual(t, w.position(1), int64(0), "the paused partition moved")
		}
		out, errOut, code = w.cli("resume", "--consumer", w.name, "--topic", w.topic, "--partition", "1")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "resumed "+w.topic+"/1 of consumer "+w.name)
		waitUntil(t, time.Minute, "partition 1 processed after resume", func() bool { return w.position(1) == 20 })
		w.requireEffectsOnce(40)
	})

	t.Run("pausing twice keeps the first pause, and says so", func(t *testing.T) {
		_, errOut, code := w.cli("pause", "--consumer", w.name, "--reason", "first", "--by", "alice")
		require.Equal(t, 0, code, errOut)
		out, errOut, code := w.cli("pause", "--consumer", w.name, "--reason", "second")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "every topic of consumer "+w.name+" was paused already")
		require.Contains(t, out, "by alice: first; it holds until resumed")
		out, errOut, code = w.cli("--json", "pause", "--consumer", w.name)
		require.Equal(t, 0, code, errOut)
		var r pauseResult
		require.NoError(t, json.Unmarshal([]byte(out), &r))
		require.False(t, r.Changed)
		require.Equal(t, "alice", r.By)
		require.Equal(t, "first", r.Reason)
		_, errOut, code = w.cli("resume", "--consumer", w.name)
		require.Equal(t, 0, code, errOut)
	})

	t.Run("a pause for a time is shown with its end, and ends by itself", func(t *testing.T) {
		out, errOut, code := w.cli("pause", "--consumer", w.name, "--topic", w.topic, "--partition", "0", "--for", "30s", "--reason", "window")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "paused "+w.topic+"/0 of consumer "+w.name+" until ")
		require.Contains(t, out, "(or resumed before)")
		out, errOut, code = w.cli("--json", "status", "--consumer", w.name)
		require.Equal(t, 0, code, errOut)
		var r statusReport
		require.NoError(t, json.Unmarshal([]byte(out), &r))
		require.Len(t, r.Pauses, 1)
		require.InDelta(t, 30, r.Pauses[0].Until.Sub(r.Pauses[0].Since).Seconds(), 0.5, "ends --for after it began")
		out, errOut, code = w.cli("status", "--consumer", w.name)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "PAUSED "+w.topic+"/0 since ")
		require.Contains(t, out, " until "+r.Pauses[0].Until.UTC().Format(time.RFC3339))

		out, errOut, code = w.cli("pause", "--consumer", w.name, "--topic", w.topic, "--partition", "0", "--for", "1h")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "was paused already", "a second pause keeps the first")
		require.Contains(t, out, ": window; it holds until ", "lengthened to the later end")
		_, errOut, code = w.cli("pause", "--consumer", w.name, "--topic", w.topic, "--partition", "0", "--for", "1s")
		require.Equal(t, 0, code, errOut)
		_, errOut, code = w.cli("resume", "--consumer", w.name, "--topic", w.topic, "--partition", "0")
		require.Equal(t, 0, code, errOut)

		_, errOut, code = w.cli("pause", "--consumer", w.name, "--topic", w.topic, "--partition", "0", "--for", "1s")
		require.Equal(t, 0, code, errOut)
		srv := w.servePage(w.env(), serveOptions{})
		pausesProbed := func() int {
			resp, body := get(t, srv, "/readyz")
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			var ready struct {
				Consumers []consumerProbe `json:"consumers"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &ready))
			for _, c := range ready.Consumers {
				if c.Name == w.name {
					return c.Paused
				}
			}
			return -1
		}
		require.Equal(t, 1, pausesProbed(), "the readiness probe counts the pause while it holds")
		waitUntil(t, time.Minute, "the pause to end by itself", func() bool {
			out, _, code := w.cli("--json", "status", "--consumer", w.name)
			var r statusReport
			return code == 0 && json.Unmarshal([]byte(out), &r) == nil && len(r.Pauses) == 0
		})
		require.Zero(t, pausesProbed(), "the readiness probe counts a pause that ended")
		out, errOut, code = w.cli("resume", "--consumer", w.name, "--topic", w.topic, "--partition", "0")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "had no pause of its own; nothing changed", "a pause that ended is not resumed")
	})

	t.Run("resume says when a wider pause still holds the scope", func(t *testing.T) {
		_, errOut, code := w.cli("pause", "--consumer", w.name, "--topic", w.topic)
		require.Equal(t, 0, code, errOut)
		out, errOut, code := w.cli("resume", "--consumer", w.name, "--topic", w.topic, "--partition", "0")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "had no pause of its own; nothing changed; the pause of topic "+w.topic+" still holds it: kafkaonce resume --consumer "+w.name+" --topic "+w.topic)
		out, errOut, code = w.cli("resume", "--consumer", w.name, "--topic", w.topic)
		require.Equal(t, 0, code, errOut)
		require.NotContains(t, out, "still holds")
	})

	t.Run("a scope that cannot be right is refused, saying why", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"pause"}, "--consumer is required"},
			{[]string{"pause", "--consumer", w.name, "--partition", "1"}, "--partition needs --topic"},
			{[]string{"resume", "--consumer", w.name, "--topic", w.topic, "--partition", "-2"}, "--partition -2 is negative"},
			{[]string{"pause", "--consumer", w.name, "--topic", "no-such-topic"}, `not "no-such-topic": check --topic`},
			{[]string{"pause", "--consumer", w.name, "--topic", w.topic, "--reason", "x", "extra"}, "unknown command"},
			{[]string{"pause", "--consumer", w.name, "--for", "0s"}, "--for 0s is too short"},
			{[]string{"pause", "--consumer", w.name, "--for", "-5m"}, "--for -5m0s is too short"},
			{[]string{"pause", "--consumer", w.name, "--for", "soon"}, `invalid argument "soon" for "--for"`},
		} {
			_, errOut, code := w.cli(c.args...)
			require.Equal(t, 2, code, strings.Join(c.args, " "))
			require.Contains(t, errOut, c.want, strings.Join(c.args, " "))
		}
	})
}

// The page's pause and resume: a link on each partition and consumer, a
// confirmation that asks why, and the pause shown with who, when and why.
func TestServePausesAndResumes(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.produce(4, "m")
	w.consume(nil, 2)
	srv := w.servePage(w.env(), serveOptions{allowActions: true})
	pausePath := "/consumers/" + w.name + "/pause?topic=" + w.topic + "&partition=1"

	_, body := get(t, srv, "/")
	require.Contains(t, body, `href="/consumers/`+w.name+`/pause?topic=`+w.topic+`&amp;partition=1"`)
	res, body := get(t, srv, pausePath)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "kafkaonce pause --consumer "+w.name+" --topic "+w.topic+" --partition 1")
	require.Contains(t, body, `name="reason"`)
	require.Contains(t, body, `name="for"`)
	token := tokenOf(t, res, body)
	res, body = post(t, srv, pausePath, srv.URL, token, token, "reason", "x", "for", "soon")
	require.Equal(t, http.StatusBadRequest, res.StatusCode, "a duration the form cannot mean")
	require.Contains(t, body, `for "soon" is not how long a pause lasts`)
	res, _ = post(t, srv, pausePath, srv.URL, token, token, "reason", "checking <offset> 3")
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/?done=paused", res.Header.Get("Location"))

	_, body = get(t, srv, "/")
	require.Contains(t, body, "<strong>"+w.topic+"/1 paused</strong>")
	require.Contains(t, body, "checking &lt;offset&gt; 3", "the reason is shown as text")
	require.Contains(t, body, "by kafkaonce serve, from 127.0.0.1:")
	require.Contains(t, body, `<tr class="paused">`)
	out, errOut, code := w.cli("status", "--consumer", w.name)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "PAUSED "+w.topic+"/1 since ")
	require.Contains(t, out, "(kafkaonce resume --consumer "+w.name+" --topic "+w.topic+" --partition 1)")

	resumePath := "/consumers/" + w.name + "/resume?topic=" + w.topic + "&partition=1"
	require.Contains(t, body, `href="`+strings.ReplaceAll(resumePath, "&", "&amp;")+`"`)
	res, _ = post(t, srv, resumePath, srv.URL, token, token)
	require.Equal(t, "/?done=resumed", res.Header.Get("Location"))
	res, _ = post(t, srv, resumePath, srv.URL, token, token)
	require.Equal(t, "/?done=unpaused", res.Header.Get("Location"), "resuming again changes nothing, and says so")
	_, body = get(t, srv, "/")
	require.NotContains(t, body, "paused</strong>")

	res, _ = get(t, srv, "/consumers/"+w.name+"/pause?partition=1")
	require.Equal(t, http.StatusBadRequest, res.StatusCode, "a partition without its topic")

	res, _ = post(t, srv, pausePath, srv.URL, token, token, "reason", "window", "for", "1h")
	require.Equal(t, "/?done=paused", res.Header.Get("Location"))
	_, body = get(t, srv, "/")
	require.Contains(t, body, "when the pause ends by itself, or until resumed before", "the page shows the pause's end")
	res, _ = post(t, srv, resumePath, srv.URL, token, token)
	require.Equal(t, "/?done=resumed", res.Header.Get("Location"))
	res, _ = post(t, srv, pausePath, "http://evil.example", token, token)
	require.Equal(t, http.StatusForbidden, res.StatusCode, "a pause from another origin")
}

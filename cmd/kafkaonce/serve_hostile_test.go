package main

// kafkaonce serve against hostile hosts, ids, texts and sizes, and a
// database or broker that stops answering: each test names the promise it
// checks, its input and what the page must do.

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
	"github.com/kafkaonce/kafkaonce/opspage"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// sendNoRedirect sends req to srv without following redirects.
func sendNoRedirect(t *testing.T, srv *httptest.Server, req *http.Request) (*http.Response, string) {
	t.Helper()
	client := *srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	res, err := client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, string(b)
}

// The page (docs/operations.md, "Security"): the Host header is checked, against DNS
// rebinding. Served with --allow-remote --listen 0.0.0.0:8080
// --allow-actions (the documented way to put it behind an authenticating
// proxy, which leaves the socket reachable on the internal network), a
// page that answered any Host would be same-origin with a site that
// rebinds its own name to the server's address: that site's script could
// read a confirmation page's token and POST with an Origin equal to the
// Host. A Host the page is not known by is refused (421), as on loopback;
// on every interface the operator names the hosts the page is served as.
func TestServeRemoteOnEveryInterfaceAnswersARebindingHost(t *testing.T) {
	t.Parallel()
	w := newPoisoned(t)
	bad3 := strconv.FormatInt(w.letterID("bad3"), 10)
	for _, listen := range []string{"0.0.0.0:8080", ":8080", "[::]:8080"} {
		srv := w.servePage(w.env(), serveOptions{allowRemote: true, allowActions: true, listen: listen})
		const rebound = "rebound.example:8080"
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/letters/"+bad3+"/settle", nil)
		require.NoError(t, err)
		req.Host = rebound
		res, body := sendNoRedirect(t, srv, req)
		if res.StatusCode == http.StatusOK {
			// Carry the attack through, to show what it reaches.
			token := tokenOf(t, res, body)
			req, err = http.NewRequest(http.MethodPost, srv.URL+"/letters/"+bad3+"/settle", strings.NewReader(url.Values{"csrf": {token}}.Encode()))
			require.NoError(t, err)
			req.Host = rebound
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", "http://"+rebound)
			req.AddCookie(&http.Cookie{Name: opspage.CSRFCookie, Value: token})
			res2, _ := sendNoRedirect(t, srv, req)
			settled := w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("dead_letters")+` WHERE id = $1 AND settled_at IS NOT NULL`, bad3)
			t.Errorf("--listen %s: Host %s was served (200) and the rebinding page's POST answered %d; letter %s settled: %v",
				listen, rebound, res2.StatusCode, bad3, settled == 1)
			w.db.Exec(t, `UPDATE `+w.db.Table("dead_letters")+` SET settled_at = NULL WHERE id = $1`, bad3)
			continue
		}
		require.Equal(t, http.StatusMisdirectedRequest, res.StatusCode, listen)
	}
}

// The page (docs/operations.md, "Security"): ids are escaped in URLs. An outbox id is the
// user's and may hold "/" ("email:order/42"), or be crafted as
// "x/../../letters/<id>/settle?". html/template normalizes a URL's path
// without escaping "/", "?" or "#" in it, so an unescaped id would make
// one row's un-park link 404, or open another action's page. The id is
// path-escaped (/outbox/email:order%2F42/unpark), and the link opens that
// row's confirmation.
func TestServeUnparkLinkOfAnOutboxIDWithASlash(t *testing.T) {
	t.Parallel()
	w := newPoisoned(t)
	bad3 := strconv.FormatInt(w.letterID("bad3"), 10)
	box, err := outbox.New(w.db.Schema)
	require.NoError(t, err)
	ids := []string{"email:order/42", "x/../../letters/" + bad3 + "/settle?"}
	for _, id := range ids {
		tx, err := w.db.Pool.Begin(context.Background())
		require.NoError(t, err)
		_, err = box.Write(context.Background(), tx, outbox.Message{ID: id, Destination: "orders", Key: []byte("k"), Value: []byte("v")})
		require.NoError(t, err)
		require.NoError(t, tx.Commit(context.Background()))
		w.db.Exec(t, `UPDATE `+w.db.Table("outbox")+` SET failed_at = now(), attempts = 9, last_error = 'no' WHERE id = $1`, id)
	}
	srv := w.servePage(w.env(), serveOptions{allowActions: true})
	_, body := get(t, srv, "/")
	links := regexp.MustCompile(`href="(/outbox/[^"]*)"`).FindAllStringSubmatch(body, -1)
	require.Len(t, links, 2, body)
	for _, l := range links {
		href := strings.ReplaceAll(l[1], "&amp;", "&")
		u, err := url.Parse(srv.URL + "/")
		require.NoError(t, err)
		target := u.ResolveReference(&url.URL{Path: "", RawPath: ""})
		ref, err := url.Parse(href)
		require.NoError(t, err)
		target = target.ResolveReference(ref) // as a browser resolves it
		res, page := get(t, srv, target.RequestURI())
		ok := res.StatusCode == http.StatusOK && strings.Contains(page, "Un-park outbox row")
		var which string
		for _, id := range ids {
			if strings.Contains(page, "Un-park outbox row "+templateEscape(id)) {
				which = id
			}
		}
		if !ok || which == "" {
			t.Errorf("the un-park link %q leads to %s (%d), not to the confirmation of its row: %.120q", href, target.RequestURI(), res.StatusCode, page)
		}
	}
}

func templateEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "'", "&#39;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "+", "&#43;").Replace(s)
}

// blackhole accepts connections and never answers: a broker or server that
// hangs (a network partition, a stuck process).
func blackhole(t *testing.T) string {
	t.Helper()
	silent, err := faultproxy.StartSilent()
	require.NoError(t, err)
	t.Cleanup(func() { silent.Close() })
	return silent.Addr()
}

// timedGet fetches path with a deadline, and reports how long it took and
// whether it answered.
func timedGet(t *testing.T, srv *httptest.Server, path string, limit time.Duration) (time.Duration, int, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
	require.NoError(t, err)
	start := time.Now()
	res, err := srv.Client().Do(req)
	if err != nil {
		return time.Since(start), 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return time.Since(start), res.StatusCode, string(b), err
}

// The page (docs/operations.md, "Security"): the page does not hang when Kafka does. With a
// broker that accepts connections and never answers, the page still
// shows what Postgres holds and says Kafka could not be read, within a
// bound an operator waits for (20s; kafkaadmin's own timeout is 15s).
func TestServePageAnswersWhileKafkaHangs(t *testing.T) {
	t.Parallel()
	w := newPoisoned(t)
	env := w.env()
	env["KAFKA_BROKERS"] = blackhole(t)
	srv := w.servePage(env, serveOptions{})
	took, code, body, err := timedGet(t, srv, "/", 40*time.Second)
	t.Logf("GET / with Kafka hanging: %v, %d, %v", took, code, err)
	require.NoError(t, err, "the page did not answer within 40s")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, w.name)
	require.Contains(t, body, `class="error"`)
	require.Contains(t, body, "KAFKA NOT READ for topic "+w.topic+": its partitions")
	require.Regexp(t, `<td class="n">-</td><td class="n">5</td><td class="n">-</td>`, body, "the stored position, with Kafka's columns unknown")
	require.Less(t, took, 20*time.Second, "the page answered, but only after %v", took)
}

// The page (docs/operations.md, "Security"): the page does not hang when Postgres does. The
// database stops answering after the page started (the connection stays
// open; nothing comes back), and every read runs with the request's
// context alone: no statement timeout, no server WriteTimeout. An error
// page comes within 20s. A Postgres that refuses connections is checked
// too.
func TestServePageAnswersWhilePostgresStalls(t *testing.T) {
	t.Parallel()
	w := newPoisoned(t)
	proxy, err := faultproxy.Start(w.db.ServerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.SetLatency(0); _ = proxy.Close() })
	env := w.env()
	env["DATABASE_URL"] = strings.Replace(w.db.URL, w.db.ServerAddr(t), proxy.Addr(), 1)
	require.NotEqual(t, w.db.URL, env["DATABASE_URL"])
	srv := w.servePage(env, serveOptions{})
	_, code, _, err := timedGet(t, srv, "/", 20*time.Second)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)

	// Down: the connections are cut, new ones refused... by a cut proxy
	// that still accepts; first cut them and see the page answer.
	proxy.CutAll()
	took, code, _, err := timedGet(t, srv, "/", 20*time.Second)
	t.Logf("GET / after the connections were cut: %v, %d, %v", took, code, err)
	require.NoError(t, err)

	// Stalled.
	proxy.SetLatency(30 * time.Second)
	proxy.CutAll()
	took, code, _, err = timedGet(t, srv, "/", 20*time.Second)
	t.Logf("GET / with Postgres stalled: %v, %d, %v", took, code, err)
	require.NoError(t, err, "the page did not answer within 20s while Postgres stalled")
}

// The page (docs/operations.md, "Security"): large tables are bounded. The overview shows
// ids, sources and errors, never values or payloads, so it must not read
// them: with 24 open letters and 24 parked outbox rows of 1 MiB each
// (Kafka's default message.max.bytes), one GET / allocates under 8 MiB,
// not the 48 MiB of values. Not parallel: it measures the process's
// allocations.
func TestServeOverviewDoesNotReadTheValuesItDoesNotShow(t *testing.T) {
	w := newPoisoned(t)
	big := strings.Repeat("v", 1<<20)
	for i := 0; i < 24; i++ {
		w.db.Exec(t, `INSERT INTO `+w.db.Table("dead_letters")+` (consumer, topic, partition, kafka_offset, message_id, message_value, error_class, error, attempts, first_failed_at, last_failed_at)
VALUES ($1, $2, 0, $3, $4, convert_to($5, 'UTF8'), 'permanent', 'no', 1, now(), now())`, w.name, w.topic, 1000+i, "big"+strconv.Itoa(i), big)
		w.db.Exec(t, `INSERT INTO `+w.db.Table("outbox")+` (id, destination, key_bucket, message_value, failed_at, attempts)
SELECT $1, 'orders', 0, convert_to($2, 'UTF8'), now(), 9`, "bigrow"+strconv.Itoa(i), big)
	}
	srv := w.servePage(w.env(), serveOptions{})
	_, body := get(t, srv, "/") // warm up
	require.Contains(t, body, "big23")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res, body := get(t, srv, "/")
	runtime.ReadMemStats(&after)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Less(t, len(body), 1<<20, "the page itself is small")
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("one GET / allocated %d MiB for a page of %d KiB", alloc>>20, len(body)>>10)
	require.Less(t, alloc, uint64(8<<20), "the overview read the values it does not show")
}

// The page (docs/operations.md, "Security"): hostile names and texts from every column the page
// shows are escaped in body, attributes (id="consumer-..."), <title> and
// <pre>; javascript: destinations are never links; invalid UTF-8 and huge
// values are shown as bounded base64; ids from the URL that are negative,
// too large, or SQL find nothing and change nothing.
func TestServeHostileTextIsEscapedEverywhere(t *testing.T) {
	t.Parallel()
	w := newPoisoned(t)
	const x = `"'><img src=x onerror=alert(1)><script>alert(2)</script>`
	name := "c" + x
	topic := "t" + x
	w.db.Exec(t, `INSERT INTO `+w.db.Table("consumer_offsets")+` (consumer, topic, partition, next_offset) VALUES ($1, $2, 0, 1)`, name, topic)
	var id int64
	require.NoError(t, w.db.Pool.QueryRow(context.Background(), `INSERT INTO `+w.db.Table("dead_letters")+`
 (consumer, topic, partition, kafka_offset, message_id, message_key, message_value, headers, error_class, error, attempts, first_failed_at, last_failed_at)
 VALUES ($1, $2, 0, 7, $3, $4, $5, $6::jsonb, $7, $8, 1, now(), now()) RETURNING id`,
		name, topic, "m"+x, []byte("javascript:alert(3)"), append([]byte{0xff, 0xfe}, []byte(strings.Repeat(x, 1<<14))...),
		`[{"key": "h`+strings.ReplaceAll(x, `"`, `\"`)+`", "value": "`+"PGI+Ym9sZDwvYj4="+`"}]`, "cls"+x, "err"+x).Scan(&id))
	w.db.Exec(t, `INSERT INTO `+w.db.Table("outbox")+` (id, destination, key_bucket, message_key, failed_at, attempts, last_error)
VALUES ($1, $2, 0, $3, now(), 9, $4)`, "o"+x, "javascript:alert(4)"+x, []byte(x), "last"+x)
	srv := w.servePage(w.env(), serveOptions{allowActions: true})
	sid := strconv.FormatInt(id, 10)
	for _, path := range []string{"/", "/letters/" + sid, "/letters/" + sid + "/redrive", "/letters/" + sid + "/settle",
		"/outbox/" + url.PathEscape("o"+x) + "/unpark"} {
		res, body := get(t, srv, path)
		require.Equal(t, http.StatusOK, res.StatusCode, path)
		for _, raw := range []string{"<img", "<script", `"'>`, `href="javascript:`, "<b>bold"} {
			require.NotContains(t, body, raw, path)
		}
		require.Less(t, len(body), 200<<10, "%s is bounded", path)
	}
	_, body := get(t, srv, "/letters/"+sid)
	require.Contains(t, body, "base64:", "invalid UTF-8 is shown as base64")
	require.Contains(t, body, "bytes in all)", "and cut")

	for _, bad := range []string{"-1", "0", "9223372036854775807", "9223372036854775808", "1%20OR%201=1", "1;DROP%20TABLE%20x", "%00", "1e3"} {
		res, _ := get(t, srv, "/letters/"+bad)
		require.Equal(t, http.StatusNotFound, res.StatusCode, bad)
		res, _ = get(t, srv, "/letters/"+bad+"/settle")
		require.Equal(t, http.StatusNotFound, res.StatusCode, bad)
	}
	require.EqualValues(t, 0, w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("dead_letters")+` WHERE settled_at IS NOT NULL OR redrive_requested_at IS NOT NULL`))
}

// The page (docs/operations.md, "Security"): with --allow-actions, GET and HEAD of every action
// path (the confirmation pages) change nothing, however often, and a
// POST of a well-formed form without the Origin header (old clients,
// curl) is refused.
func TestServeConfirmationReadsChangeNothing(t *testing.T) {
	t.Parallel()
	w := newPoisoned(t)
	parked := w.park()
	srv := w.servePage(w.env(), serveOptions{allowActions: true})
	before := w.actionState(parked)
	bad1 := strconv.FormatInt(w.letterID("bad1"), 10)
	for _, path := range []string{"/letters/" + bad1 + "/redrive", "/letters/" + bad1 + "/settle", "/outbox/" + parked + "/unpark"} {
		for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions} {
			req, err := http.NewRequest(method, srv.URL+path+"?csrf=x&done=settled", nil)
			require.NoError(t, err)
			res, _ := sendNoRedirect(t, srv, req)
			require.NotEqual(t, http.StatusSeeOther, res.StatusCode, "%s %s", method, path)
		}
	}
	require.Equal(t, before, w.actionState(parked))
}

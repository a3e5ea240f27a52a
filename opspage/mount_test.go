package opspage_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/opspage"
)

const prefix = "/ops/kafkaonce"

// mounted is an application's server with the page under prefix, behind
// the application's own authentication: a toy one that lets a request in
// with the operator's bearer token, and counts those that reach the page.
type mounted struct {
	srv     *httptest.Server
	reached int
	db      *testenv.DB
	letter  int64
}

func mount(t *testing.T, strip bool) *mounted {
	t.Helper()
	db := testenv.NewDB(t)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	name := testenv.Name(t, "c")
	// What a consumer leaves: a position, two claims, one set aside.
	db.Exec(t, `INSERT INTO `+db.Table("consumer_offsets")+` (consumer, topic, partition, next_offset) VALUES ($1, $2, 0, 2)`, name, topic)
	db.Exec(t, `INSERT INTO `+db.Table("consumers")+` (name) VALUES ($1)`, name)
	db.Exec(t, `INSERT INTO `+db.Table("processed_messages")+` (consumer_id, partition, kafka_offset, message_id, fingerprint, topic, status)
SELECT (SELECT id FROM `+db.Table("consumers")+` WHERE name = $1), 0, g, 'm' || g, decode(repeat('00', 32), 'hex'), $2, CASE g WHEN 1 THEN 'dead_lettered' ELSE 'applied' END
FROM generate_series(0, 1) g`, name, topic)
	db.Exec(t, `INSERT INTO `+db.Table("dead_letters")+` (consumer, topic, partition, kafka_offset, message_id, message_value, error_class, error, attempts, first_failed_at, last_failed_at)
VALUES ($1, $2, 0, 1, 'm1', 'v', 'permanent', 'partner said no', 1, now(), now())`, name, topic)
	m := &mounted{db: db, letter: db.Int(t, `SELECT id FROM `+db.Table("dead_letters")+` WHERE consumer = $1`, name)}

	page, err := opspage.NewHandler(db.Pool, &opspage.Options{
		Schema:       db.Schema,
		Prefix:       prefix,
		AllowActions: true,
		Brokers:      k.Brokers,
		Operator:     func(r *http.Request) string { return "operator " + r.Header.Get("X-User") },
	})
	require.NoError(t, err)
	t.Cleanup(page.Close)
	var h http.Handler = page
	if strip {
		h = http.StripPrefix(prefix, page)
	}
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.reached++
		h.ServeHTTP(w, r)
	})
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer operator" {
				http.Error(w, "who are you?", http.StatusUnauthorized)
				return
			}
			r.Header.Set("X-User", "ada")
			next.ServeHTTP(w, r)
		})
	}
	mux := http.NewServeMux()
	mux.Handle(prefix+"/", auth(counted))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "the application") })
	m.srv = httptest.NewServer(mux)
	t.Cleanup(m.srv.Close)
	return m
}

// client is the operator's browser: it sends the token, keeps cookies,
// and does not follow redirects, so that the test sees them.
func (m *mounted) client(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := m.srv.Client()
	c.Jar = jar
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return c
}

func (m *mounted) do(t *testing.T, c *http.Client, method, path, origin string, form url.Values) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, m.srv.URL+path, body)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer operator")
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	res, err := c.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, string(b)
}

var linkAttr = regexp.MustCompile(`(?:href|src|action)="([^"]*)"`)

// requireUnderPrefix checks every link of a page stays under the prefix.
func requireUnderPrefix(t *testing.T, body string) {
	t.Helper()
	links := linkAttr.FindAllStringSubmatch(body, -1)
	require.NotEmpty(t, links)
	for _, l := range links {
		require.True(t, strings.HasPrefix(l[1], prefix+"/"), "link %q leaves %s", l[1], prefix)
	}
}

// The page mounted under a prefix of an application's router, behind its
// authentication, with the prefix stripped by the router or not: every
// page renders, every link, form and redirect stays under the prefix, an
// action works with the page's token and is refused from another origin,
// and a request without the application's login never reaches the page.
func TestHandlerMountedUnderAPrefixBehindAuthentication(t *testing.T) {
	t.Parallel()
	for _, strip := range []bool{false, true} {
		t.Run("strip="+strconv.FormatBool(strip), func(t *testing.T) {
			m := mount(t, strip)
			c := m.client(t)
			id := strconv.FormatInt(m.letter, 10)

			res, err := m.srv.Client().Get(m.srv.URL + prefix + "/")
			require.NoError(t, err)
			res.Body.Close()
			require.Equal(t, http.StatusUnauthorized, res.StatusCode)
			res, err = m.srv.Client().PostForm(m.srv.URL+prefix+"/letters/"+id+"/settle", url.Values{"csrf": {"x"}})
			require.NoError(t, err)
			res.Body.Close()
			require.Equal(t, http.StatusUnauthorized, res.StatusCode)
			require.Zero(t, m.reached, "unauthenticated requests never reach the page")

			res, body := m.do(t, c, "GET", prefix, "", nil)
			require.Equal(t, 3, res.StatusCode/100, body)
			require.Equal(t, prefix+"/", res.Header.Get("Location"), "the prefix without its slash leads to the page")

			res, body = m.do(t, c, "GET", prefix+"/", "", nil)
			require.Equal(t, http.StatusOK, res.StatusCode, body)
			require.Contains(t, body, "claims per minute, last hour")
			require.Contains(t, body, "2 in all")
			require.Contains(t, body, `href="`+prefix+`/letters/`+id+`"`)
			requireUnderPrefix(t, body)
			for _, ck := range res.Cookies() {
				require.Equal(t, prefix+"/", ck.Path, "the token's cookie is the page's alone")
			}

			res, body = m.do(t, c, "GET", prefix+"/style.css", "", nil)
			require.Equal(t, http.StatusOK, res.StatusCode, body)

			res, body = m.do(t, c, "GET", prefix+"/letters/"+id, "", nil)
			require.Equal(t, http.StatusOK, res.StatusCode, body)
			require.Contains(t, body, "partner said no")
			requireUnderPrefix(t, body)

			res, body = m.do(t, c, "GET", prefix+"/letters/"+id+"/settle", "", nil)
			require.Equal(t, http.StatusOK, res.StatusCode, body)
			requireUnderPrefix(t, body)
			token := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
			require.NotNil(t, token, body)
			require.Contains(t, body, `<form method="post">`, "the form posts back to its own address, under the prefix")

			res, body = m.do(t, c, "POST", prefix+"/letters/"+id+"/settle", "https://evil.example", url.Values{"csrf": {token[1]}})
			require.Equal(t, http.StatusForbidden, res.StatusCode, body)
			require.Contains(t, body, "not from this page")
			res, body = m.do(t, c, "POST", prefix+"/letters/"+id+"/settle", m.srv.URL, url.Values{"csrf": {"stale"}})
			require.Equal(t, http.StatusForbidden, res.StatusCode, body)
			require.Zero(t, m.db.Int(t, `SELECT count(*) FROM `+m.db.Table("dead_letters")+` WHERE settled_at IS NOT NULL`))

			res, body = m.do(t, c, "POST", prefix+"/letters/"+id+"/settle", m.srv.URL, url.Values{"csrf": {token[1]}})
			require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
			require.Equal(t, prefix+"/letters/"+id+"?done=settled", res.Header.Get("Location"))
			require.EqualValues(t, 1, m.db.Int(t, `SELECT count(*) FROM `+m.db.Table("dead_letters")+` WHERE settled_at IS NOT NULL`))

			res, body = m.do(t, c, "GET", res.Header.Get("Location"), "", nil)
			require.Equal(t, http.StatusOK, res.StatusCode, body)
			require.Contains(t, body, "Letter settled")
		})
	}
}

func TestNewHandlerNamesWhatIsMissing(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := opspage.NewHandler(db.Pool, &opspage.Options{Schema: db.Schema})
	require.ErrorContains(t, err, "Options.Brokers")
	_, err = opspage.NewHandler(db.Pool, &opspage.Options{Schema: db.Schema, Brokers: []string{"127.0.0.1:1"}, Prefix: "ops"})
	require.ErrorContains(t, err, "Options.Prefix")
	_, err = opspage.NewHandler(nil, nil)
	require.ErrorContains(t, err, "pool")
}

// The handler takes paths with the prefix (docs/operations.md "Mounting
// the page"), from a router that need not clean them (chi, gorilla with
// SkipClean, or the page as a server's whole handler behind a middleware).
// A path with a double slash or a dot segment under the prefix is
// redirected to its clean form: that redirect, like every other, must stay
// under the prefix.
func TestHandlerRedirectsOfUncleanPathsStayUnderThePrefix(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := testenv.NewKafka(t)
	page, err := opspage.NewHandler(db.Pool, &opspage.Options{Schema: db.Schema, Prefix: prefix, AllowActions: true, Brokers: k.Brokers})
	require.NoError(t, err)
	t.Cleanup(page.Close)
	for _, p := range []string{prefix + "//letters/1", prefix + "/./", prefix + "/letters/1/../../../x", "//letters/1"} { // the last: stripped already
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "http://ops.example/", nil)
		req.URL.Path = p
		page.ServeHTTP(rec, req)
		loc := rec.Header().Get("Location")
		require.NotEmpty(t, loc, "GET %s is not redirected to its clean path", p)
		require.True(t, strings.HasPrefix(loc, prefix+"/"), "GET %s redirects to %q, outside %s", p, loc, prefix)
	}
}

// A prefix with a character that needs escaping in a URL (here "ü"; NewHandler
// takes it): the token's cookie must still be sent back to the page's
// paths ("Every link, form, redirect and the token's cookie (Path) start
// with Options.Prefix"), so that an action with the page's own form and
// token works.
func TestActionsWorkUnderAPrefixThatNeedsEscaping(t *testing.T) {
	t.Parallel()
	const pre = "/ops/kafkaonce-ü"
	db := testenv.NewDB(t)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	name := testenv.Name(t, "c")
	db.Exec(t, `INSERT INTO `+db.Table("dead_letters")+` (consumer, topic, partition, kafka_offset, message_id, message_value, error_class, error, attempts, first_failed_at, last_failed_at)
VALUES ($1, $2, 0, 1, 'm1', 'v', 'permanent', 'partner said no', 1, now(), now())`, name, topic)
	id := strconv.FormatInt(db.Int(t, `SELECT id FROM `+db.Table("dead_letters")+` WHERE consumer = $1`, name), 10)
	page, err := opspage.NewHandler(db.Pool, &opspage.Options{Schema: db.Schema, Prefix: pre, AllowActions: true, Brokers: k.Brokers})
	require.NoError(t, err)
	t.Cleanup(page.Close)
	mux := http.NewServeMux()
	mux.Handle(pre+"/", page)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := srv.Client()
	c.Jar = jar
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	escaped := (&url.URL{Path: pre}).EscapedPath()
	get := func(path string) (*http.Response, string) {
		res, err := c.Get(srv.URL + escaped + path)
		require.NoError(t, err)
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}
	res, body := get("/letters/" + id + "/settle")
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	token := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
	require.NotNil(t, token, body)

	req, err := http.NewRequest("POST", srv.URL+escaped+"/letters/"+id+"/settle", strings.NewReader(url.Values{"csrf": {token[1]}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", srv.URL)
	res, err = c.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "the page's own form, with its token, was refused: %s", b)
}

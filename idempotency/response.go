package idempotency

import (
	"bytes"
	"fmt"
	"net/http"
)

// recorder is the ResponseWriter a handler writes to: the response is kept
// until the transaction commits, then sent, and stored with the key.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func newRecorder() *recorder { return &recorder{header: http.Header{}} }

func (r *recorder) Header() http.Header { return r.header }

// WriteHeader keeps the first final status. An informational one (1xx,
// such as 103 Early Hints) is dropped: nothing reaches the client before
// the transaction commits.
func (r *recorder) WriteHeader(status int) {
	if status < 100 || status > 999 {
		// As net/http does: the handler's call fails, and rolls back.
		panic(fmt.Sprintf("invalid WriteHeader code %v", status))
	}
	if r.status == 0 && status >= 200 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}

// code is the status the handler decided: 200 when it wrote nothing.
func (r *recorder) code() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

// storable reports whether a response is kept with its key: one the
// handler decided. Not those that tell the client to try again, which a
// replay would contradict: a server error (5xx), 408 Request Timeout, 409
// Conflict, 425 Too Early and 429 Too Many Requests. Their transaction
// rolls back, and the client's retry runs afresh.
func storable(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

// send writes a response to w.
func send(w http.ResponseWriter, header http.Header, status int, body []byte) {
	for name, values := range header {
		w.Header()[name] = values
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

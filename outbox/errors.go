package outbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/permanent"
)

// Permanent marks a delivery error that retrying cannot fix (the receiver
// rejected the request as invalid, unauthorised, unknown): the row is parked
// at once. Permanent(nil) is nil.
//
// Permanent and consumer.Permanent are the same mark: an error marked by
// either is permanent to the relay and to the consumer, so a delivery
// function may return an error that a consumer handler's code marked, and
// the reverse.
func Permanent(err error) error { return permanent.Mark(err) }

// RetryAfter marks a delivery error after which the receiver asked to wait
// at least d (HTTP 429 or 503 with Retry-After).
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{err: err, after: d}
}

type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %v)", e.err, e.after)
}
func (e *retryAfterError) Unwrap() error { return e.err }

// HTTPResult classifies an HTTP exchange for the relay: nil for 2xx;
// Permanent for 4xx answers other than 408, 425 and 429 (retrying a request
// the receiver rejects only hammers it); RetryAfter for 429 and 503 that say
// when to come back; and a plain, retryable error for other 5xx answers,
// 408, 425, timeouts and broken connections. The response body is closed.
func HTTPResult(resp *http.Response, err error) error {
	if err != nil {
		var netErr net.Error
		if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("request failed, may be retried: %w", err)
		}
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	code := resp.StatusCode
	status := fmt.Errorf("HTTP %d %s", code, http.StatusText(code))
	switch {
	case code >= 200 && code < 300:
		return nil
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After")); ok {
			return RetryAfter(status, d)
		}
		return status
	case code == http.StatusRequestTimeout || code == http.StatusTooEarly || code >= 500:
		return status
	default:
		return Permanent(status)
	}
}

// parseRetryAfter reads delay-seconds or an HTTP date.
func parseRetryAfter(v string) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0), true
	}
	return 0, false
}

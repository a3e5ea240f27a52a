package testenv

import (
	"context"
	"testing"
)

// Background runs run (a relay's or a consumer's Run) in a goroutine until
// the test ends, then cancels its context and requires it to have
// returned nil: what stopped early with an error fails the test, and
// nothing outlives it for Main's leak check to find.
func Background(tb testing.TB, run func(ctx context.Context) error) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("run in the background: %v", err)
		}
	})
}

package containers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
)

// CheckBound is how long Check waits for the container engine to answer.
const CheckBound = 5 * time.Second

// ErrSkipped wraps every error of Check: containers cannot run here, and
// the error says why.
var ErrSkipped = errors.New("containers skipped")

var checked struct {
	sync.Once
	err error
}

// Check reports whether a container engine answers, as testcontainers-go
// finds it. It asks once per process and remembers the answer, and it
// returns within CheckBound even when the engine hangs: testcontainers'
// discovery of the engine does not take a context, so the question runs
// on a goroutine of its own, which is left to finish (or not) when the
// bound passes. The error wraps ErrSkipped and says why: the engine is off
// by KAFKAONCE_DOCKER=off, not found, or did not answer in time.
func (Docker) Check(ctx context.Context) error {
	checked.Do(func() { checked.err = check(ctx, CheckBound) })
	return checked.err
}

// check asks testcontainers for its provider and the engine's health,
// bounded by bound.
func check(ctx context.Context, bound time.Duration) error {
	if os.Getenv("KAFKAONCE_DOCKER") == "off" {
		return fmt.Errorf("%w: KAFKAONCE_DOCKER=off", ErrSkipped)
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	answer := make(chan error, 1)
	go func() {
		p, err := testcontainers.NewDockerProvider(testcontainers.WithLogger(tclog.NewNoopLogger()))
		if err != nil {
			answer <- fmt.Errorf("%w: no container engine found (testcontainers: %v)", ErrSkipped, err)
			return
		}
		if err := p.Health(ctx); err != nil {
			answer <- fmt.Errorf("%w: the container engine did not answer (testcontainers: %v)", ErrSkipped, err)
			return
		}
		answer <- nil
	}()
	select {
	case err := <-answer:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: the container engine did not answer within %v (set KAFKAONCE_DOCKER=off to skip asking)", ErrSkipped, bound)
	}
}

package containers

import (
	"context"
	"errors"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

// terminator returns the function that removes c (nothing, for a
// container that was never created), bounded by a minute.
func terminator(c testcontainers.Container) func() error {
	return func() error {
		if c == nil {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return testcontainers.TerminateContainer(c, testcontainers.StopContext(ctx))
	}
}

// joinRemove removes what a failed start created, and joins the removal's
// error to the start's.
func joinRemove(err error, remove func() error) error {
	if rerr := remove(); rerr != nil {
		return errors.Join(err, rerr)
	}
	return err
}

package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/kafkaonce/kafkaonce/pauses"
)

// Pause pauses scope of this consumer (pauses.All, pauses.Topic or
// pauses.Partition), giving reason: each partition it covers finishes the
// batch it is in, then keeps its assignment, fetches nothing and holds no
// transaction open until Resume. A partition waiting between the retries
// of a failing message stops waiting and is tried again after it resumes,
// so a pause is also how to stop a message from holding its partition
// while its downstream is down.
//
// The pause is stored in Postgres (the pauses table, package pauses), so
// it holds across rebalances and restarts, and every member of the group
// obeys it, in this process at once and in others within a second or so.
// It needs no running consumer: Pause may be called before Run, or after
// it returned. Pausing what is paused changes nothing, except that a
// pause for a time (PauseFor) then lasts until resumed; the first pause's
// reason stands. A topic the consumer does not read is refused.
// HookPartitionPaused reports each partition paused and resumed; kafkaonce
// status and the page show the pauses.
func (c *Consumer) Pause(ctx context.Context, scope pauses.Scope, reason string) error {
	return c.engine.Pause(ctx, scope, 0, reason)
}

// PauseFor pauses scope as Pause does, for d: the pause ends by itself d
// from now by the database server's clock, whichever machine's clock is
// off, and every member fetches again at its first read of the pauses
// after that (within a second or so). Resume lifts it earlier. Pausing a
// scope paused already keeps the first pause, lengthened to end d from
// now if that is later; a pause until resumed stays so.
// HookPartitionPaused, kafkaonce status and the page show the end.
func (c *Consumer) PauseFor(ctx context.Context, scope pauses.Scope, d time.Duration, reason string) error {
	if d <= 0 {
		return fmt.Errorf("consumer: PauseFor %s: a pause for %s would end before it starts; use Pause for a pause until resumed", scope, d)
	}
	return c.engine.Pause(ctx, scope, d, reason)
}

// Resume lifts the pause of scope (the same scope Pause was given): the
// partitions no other pause covers fetch again from where they stopped.
// A partition is paused while any pause covers it, so resuming one
// partition of a paused topic changes nothing. Resuming what is not
// paused changes nothing.
func (c *Consumer) Resume(ctx context.Context, scope pauses.Scope) error {
	return c.engine.Resume(ctx, scope)
}

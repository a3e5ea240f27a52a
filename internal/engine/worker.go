package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/attempts"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/pace"
	"github.com/kafkaonce/kafkaonce/internal/recent"
	"github.com/kafkaonce/kafkaonce/internal/retry"
	"github.com/kafkaonce/kafkaonce/internal/store/positions"
	"github.com/kafkaonce/kafkaonce/internal/txguard"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// worker processes one assigned partition, from its assignment to its
// revocation.
type worker struct {
	*deps
	committer *committer
	// hold is this worker's run of the partition: its marks count while
	// it is the partition's current one.
	hold      *partitionRun
	topic     string
	partition int
	// kafkaOffset is the group's committed offset at assignment, -1 when
	// there is none.
	kafkaOffset int64
	// topicID is the id of the topic the partition's position counts in,
	// as read at assignment or resumption (zero: the broker gives none):
	// the fetches hand out nothing of a topic with another id. topicStored
	// is set once the stored position is known to carry it.
	topicID     kafkaclient.TopicID
	topicStored bool
	// batchCheck is the commit check of the partition's batches, for the
	// guard around a handler's transaction (see positions.CommitCheck).
	batchCheck *txguard.CommitCheck

	// next is the offset after the last message processed (or the start
	// offset); it is where fetching resumes after a fetch error.
	next int64
	// carefulUntil means messages below this offset are processed one at a
	// time, counting attempts, because the previous run did not get past
	// them (see runAlone).
	carefulUntil int64
	// attemptsUpTo is the highest offset that may have a message_attempts
	// row, or -1.
	attemptsUpTo int64
	// recent remembers recent contents, for suspect duplicates (nil when
	// detection is off).
	recent *recent.Window
	// hwm is the log end offset as of the last fetch.
	hwm int64
	// progress is when the worker last moved, for Health.
	progress *progress
	// started is set once the run recorded its start, as run number runID.
	started bool
	runID   int64
	// positionKnown means the stored position is w.next (a row existed at
	// assignment, or this worker committed one). assignedStart is where the
	// run started.
	positionKnown bool
	assignedStart int64
	// origin is where the partition's processing first started in this
	// store, -1 when not known (the position was stored before offset
	// commits carried it); meta is the mark committed with the partition's
	// offsets, which carries it (see origin.go).
	origin int64
	meta   string

	// Buffers reused from batch to batch: dropped when an attempt that
	// may still read them is abandoned.
	raw   []kafkaclient.Record
	items []item
	// scratch is the scratch space of the last attempt that returned, for
	// the next (see txAttempt).
	scratch *batchState

	// sawDuplicates means the last batch held messages already claimed that
	// were not foreseen, so the next one probably does too and claims
	// first (see oneTrip).
	sawDuplicates bool

	// pace sizes the partition's transactions from the races for rows
	// they lost (see contention.go). wasSerialized is whether the last
	// transaction took the consumer's gate; paceShown is what the run's
	// record shows of the pace.
	pace          *pace.Pace
	wasSerialized bool
	paceShown     attempts.Pace
	// raceUntil means a transaction found the gate held too long; until then
	// the partition's transactions race (see gateBusyError).
	raceUntil time.Time

	// lag is what the partition's lag is reported from (see lag.go).
	lag lagView
}

// run processes the partition until stop is done. A partition that cannot
// go on (a message it must not skip) is reported and then parked until its
// revocation: it stays this member's, so that no other member goes past
// the message either.
func (w *worker) run(stop, work context.Context) {
	err := w.consume(stop, work)
	if err == nil || stop.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, errInterrupted)) {
		w.endCleanly(work)
		return
	}
	var perr *kafkaoncetype.PartitionError
	if !errors.As(err, &perr) {
		perr = &kafkaoncetype.PartitionError{Topic: w.topic, Partition: w.partition, Err: err}
	}
	w.report(stop, perr)
	w.progress.stop(perr.Err.Error())
	<-stop.Done()
}

// endCleanly records that this run ended by revocation or shutdown, not by
// dying, so the next run does not start one message at a time.
func (w *worker) endCleanly(work context.Context) {
	if !w.started {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(work), 2*time.Second)
	defer cancel()
	if err := w.attempts.Ended(ctx, w.db, w.cfg.Name, w.topic, w.partition, w.runID); err != nil {
		w.log.Warn("could not record a clean end of the partition run", w.logAttrs(slog.String("error", err.Error()))...)
	}
}

func (w *worker) report(ctx context.Context, perr *kafkaoncetype.PartitionError) {
	attrs := []any{slog.String("topic", w.topic), slog.Int("partition", w.partition), slog.String("error", perr.Err.Error())}
	var merr *kafkaoncetype.MessageError
	if errors.As(perr, &merr) {
		attrs = append(attrs, slog.Int64("offset", merr.Offset), slog.String("message_id", merr.MessageID))
	}
	var conflict *kafkaoncetype.FingerprintConflictError
	if errors.As(perr, &conflict) {
		attrs = append(attrs, slog.Int64("offset", conflict.Offset), slog.String("message_id", conflict.MessageID))
		for _, h := range w.hooks.Conflict {
			h(ctx, conflict)
		}
	}
	w.log.Error("partition stopped: nothing after this message is processed until it is resolved", attrs...)
	w.recordStop(ctx, perr)
	for _, h := range w.hooks.Stopped {
		h(ctx, perr)
	}
}

// recordStop writes the stop and its reason on the partition's run record,
// where operators in other processes see it (kafkaonce serve). The log and
// the hooks have it already: a failure to record it is only logged.
func (w *worker) recordStop(ctx context.Context, perr *kafkaoncetype.PartitionError) {
	var run int64
	if w.started {
		run = w.runID
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := w.attempts.Stopped(ctx, w.db, w.cfg.Name, w.topic, w.partition, run, perr.Err.Error()); err != nil && ctx.Err() == nil {
		w.log.Warn("could not record the partition's stop for operators", w.logAttrs(slog.String("error", err.Error()))...)
	}
}

func (w *worker) logAttrs(extra ...any) []any {
	return append([]any{slog.String("topic", w.topic), slog.Int("partition", w.partition)}, extra...)
}

func (w *worker) consume(stop, work context.Context) error {
	start, err := w.assign(stop, work)
	if err != nil {
		return err
	}
	w.next, w.assignedStart = start, start
	w.reportLag(work)
	if d := w.cfg.SuspectDuplicateWindow; d > 0 {
		w.recent = recent.New(kafkaoncetype.SuspectWindowMessages, d)
	}
	backoff := w.retry.New()
	for stop.Err() == nil {
		paused := w.waitWhilePaused(stop)
		if stop.Err() != nil {
			return nil
		}
		if paused {
			lost, err := w.afterPause(stop, work)
			var perr *kafkaoncetype.PartitionError
			if errors.As(err, &perr) {
				return err
			}
			if err != nil {
				return nil // interrupted: stop is done
			}
			if lost != nil && !w.resumeAfterLoss(stop, lost) {
				return nil
			}
		}
		// A pause ends the run of fetches as a revocation would: the batch
		// in progress finishes, its retries stop waiting, and the messages
		// from w.next on are fetched again once the partition is resumed.
		run, endRun := w.untilPaused(stop)
		err := w.fetchAndProcess(run, work)
		endRun()
		if stop.Err() == nil && run.Err() != nil && (err == nil || errors.Is(err, errInterrupted) || errors.Is(err, context.Canceled)) {
			continue
		}
		if err == nil || stop.Err() != nil {
			if errors.Is(err, errInterrupted) {
				return nil
			}
			return err
		}
		var perr *kafkaoncetype.PartitionError
		if errors.As(err, &perr) {
			return err
		}
		var lost *positionLostError
		if errors.As(err, &lost) {
			w.log.Error("the database lost committed transactions; fetching again from the stored position", w.logAttrs(
				slog.Int64("stored_position", lost.stored), slog.Int64("committed_up_to", lost.believed), slog.Bool("position_missing", lost.missing))...)
			if !w.resumeAfterLoss(stop, lost) {
				return nil
			}
			continue
		}
		w.log.Warn("fetch failed; reopening the partition", w.logAttrs(slog.Int64("offset", w.next), slog.String("error", err.Error()))...)
		if retry.Sleep(stop, backoff.Next()) != nil {
			return nil
		}
	}
	return nil
}

// resumeAfterLoss moves the worker to where processing goes on after its
// stored position was lost, or moved back, or went missing (see
// positionLostError): false when stop ended first. Without a stored
// position, the next commit creates one, as the first commit of a run
// does: until then there is nothing to compare with.
func (w *worker) resumeAfterLoss(stop context.Context, lost *positionLostError) bool {
	backoff := w.retry.New()
	for {
		next, err := w.lostRowRestart(stop, lost.stored)
		if err == nil {
			w.next, w.positionKnown = next, !lost.missing
			// A position that went missing takes its topic id again with
			// the row the next batch stores (see afterCommit).
			w.topicStored = w.topicStored && !lost.missing
			return true
		}
		w.log.Warn("reading the log's bounds failed; trying again", w.logAttrs(slog.String("error", err.Error()))...)
		if retry.Sleep(stop, backoff.Next()) != nil {
			return false
		}
	}
}

// fetchAndProcess reads batches from w.next until stop is done or a fetch
// fails.
func (w *worker) fetchAndProcess(stop, work context.Context) error {
	f, err := w.client.Open(kafkaclient.FetchConfig{
		Topic:     w.topic,
		Partition: w.partition,
		Start:     w.next,
		TopicID:   w.topicID,
		MaxBatch:  w.cfg.MaxBatch,
		Linger:    w.cfg.MaxWait,
		Quiet:     kafkaclient.QuietFor(w.cfg.MaxWait),
		// Every fetch hands out the offset expected next or explains the
		// gap: a loss ends the batches before it, and comes back as a
		// DeletedError.
		Processed: w.processedPosition,
		IdleCheck: kafkaclient.IdleCheckFor(w.cfg.OpenTransactionAfter),
		HeldAfter: w.cfg.OpenTransactionAfter,
		OnHeld:    func(h kafkaclient.Held) { w.reportHeld(stop, h) },
		// Records the fetches have not handed out, below the last stable
		// offset, make the wait a stall (see Health); an open
		// transaction's, past it, do not.
		OnIdleBounds: func(b kafkaclient.Bounds, next int64) {
			w.progress.waiting.Store(b.Stable <= next)
			w.sawEnd(b.Stable)
			w.reportLag(work)
		},
	})
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		// Waiting at the log's end is no stall; waiting with messages
		// ahead is, once it lasts (see Health).
		w.progress.wait(w.next >= w.hwm)
		w.raw, err = f.Next(stop, w.raw)
		w.progress.wait(false)
		if stop.Err() != nil {
			// Revoked or shutting down: start no new batch. Messages
			// fetched but not processed are fetched again by the next owner.
			// (A loss found meanwhile is the next owner's to report.)
			return nil
		}
		if err != nil {
			return w.fetchError(err)
		}
		if len(w.raw) == 0 {
			// Transaction markers after the last message, and nothing else.
			w.passMarkers(stop, work, f.Position())
			continue
		}
		if err := w.processBatch(stop, work, w.raw); err != nil {
			return err
		}
	}
}

// passMarkers moves the partition's position to to, past offsets that
// hold no message (the markers that end transactions), so that the stored
// position and the group's offset reach the log's end, as the positions of
// Kafka's own readers of committed records do. It moves the position only
// from where this worker left it: when the position moved otherwise (lost
// transactions, another member), the next batch's transaction finds out,
// as every batch's does. A failure only leaves the position where it was:
// the next batch moves it past the markers too.
func (w *worker) passMarkers(stop, work context.Context, to int64) {
	if to <= w.next || !w.positionKnown {
		return
	}
	var passed bool
	b := &pgx.Batch{}
	w.offsets.QueuePass(b, w.cfg.Name, w.topic, w.partition, w.next, to, &passed)
	if err := w.inOneTrip(work, b); err != nil {
		if stop.Err() == nil {
			w.log.Warn("could not move the position past transaction markers", w.logAttrs(slog.Int64("offset", w.next), slog.String("error", err.Error()))...)
		}
		return
	}
	if passed {
		w.next = to
		w.mark(to)
		w.reportLag(work)
	}
}

// fetchError turns a fetcher's verdict on the log into the error the
// partition stops with; any other error is returned as it is, and the
// partition is fetched again from w.next.
func (w *worker) fetchError(err error) error {
	var gone *kafkaclient.DeletedError
	var ahead *kafkaclient.AheadError
	var txn *kafkaclient.TransactionalError
	var recreated *kafkaclient.RecreatedError
	switch {
	case errors.As(err, &recreated):
		return &kafkaoncetype.PartitionError{Topic: w.topic, Partition: w.partition, Err: fmt.Errorf(
			"%w: %s; processing on would pass over the new topic's messages below offset %d. Once you have checked, run kafkaonce topic-recreated (offsets.Store.TopicRecreated) with the consumer stopped",
			kafkaoncetype.ErrTopicRecreated, recreated.Error(), w.next)}
	case errors.As(err, &gone):
		return w.deletedError(gone.From, gone.LogStart)
	case errors.As(err, &ahead):
		why := ahead.Why
		if why == "" {
			why = fmt.Sprintf("the log now ends at %d, before offset %d, where processing is", ahead.LogEnd, ahead.Expected)
		}
		return &kafkaoncetype.PartitionError{Topic: w.topic, Partition: w.partition, Err: fmt.Errorf(
			"%w: %s, so the topic was probably deleted and re-created or truncated; processing would skip its new messages. Once you have checked, reset the position (offsets.Store.Reset) to where processing should resume",
			kafkaoncetype.ErrPositionAheadOfLog, why)}
	case errors.As(err, &txn):
		return &kafkaoncetype.PartitionError{Topic: w.topic, Partition: w.partition, Err: &kafkaoncetype.MessageError{Topic: w.topic, Partition: w.partition, Offset: txn.Offset,
			Err: fmt.Errorf("%w: offset %d is a transaction marker, so the topic is written by transactional producers; the kafka-go client cannot tell records of aborted transactions from committed ones, and hands out markers as messages. Set Config.KafkaClient to consumer.FranzGo (the default), which reads committed records only", kafkaoncetype.ErrTransactionalTopic, txn.Offset)}}
	}
	return err
}

// assign decides where to start (decideStart, in start.go) from the
// group's committed offset, the stored position and the log's bounds,
// acts on the decision, and says whether to start carefully. Errors
// reaching Postgres or Kafka are retried until stop.
func (w *worker) assign(stop, work context.Context) (int64, error) {
	f := startFacts{store: w.storeID, consumer: w.cfg.Name, first: noStart}
	var p startPlan
	for {
		err := w.retryUntil(stop, "partition assignment: cannot read positions", func() (err error) {
			f.log, err = w.readLog(stop, work)
			return err
		})
		if err != nil {
			return 0, err
		}
		if err := w.checkTopic(stop, work, f.log.hasPos, f.log.storedTopic, f.log.topicID); err != nil {
			return 0, err
		}
		f.first = noStart
		p = decideStart(f)
		if p.start == noStart {
			first, again, err := w.firstStart(stop, work, f.log)
			if err != nil {
				return 0, err
			}
			if again {
				// The topic's first starts were stored just now, this
				// partition's with them: decided again from it.
				f.firstJustStored = true
				continue
			}
			f.first = first
			p = decideStart(f)
		}
		if p.store {
			// Stored before the hooks hear of it, so that they hear of the
			// start processing really begins at, once.
			stored, err := w.storeStart(stop, work, p.start)
			if err != nil {
				return 0, err
			}
			if stored != p.start {
				// Another member stored a start since this one read none:
				// it stands, and the assignment is decided again from it.
				f.firstJustStored = true
				continue
			}
		}
		break
	}
	v, start := f.log, p.start
	w.hwm = v.logEnd // until the first fetch says more
	w.sawEnd(v.stable)
	w.kafkaOffset = v.committed
	w.positionKnown = v.hasPos || p.store
	if p.store {
		w.topicStored = !w.topicID.IsZero()
	}
	w.setOrigin(p.origin)
	w.tellStart(v, p)
	if p.commit {
		w.mark(start)
	}
	a := kafkaoncetype.PartitionAssignment{Topic: w.topic, Partition: w.partition, KafkaOffset: v.committed, StoredPosition: -1,
		LogStart: v.logStart, LogEnd: v.logEnd, Start: start}
	if v.hasPos {
		a.StoredPosition = v.pos
	}
	for _, h := range w.hooks.Assigned {
		h(stop, a)
	}
	if p.problem != startFine && stop.Err() != nil {
		// The generation ended: the partition may be another member's
		// by now, and these reads are its business.
		return 0, errInterrupted
	}
	switch p.problem {
	case startAheadOfLog:
		which := "stored position"
		if !v.hasPos {
			which = "group's committed offset"
		}
		return 0, &kafkaoncetype.PartitionError{Topic: w.topic, Partition: w.partition, Err: fmt.Errorf(
			"%w: the %s is %d but the log ends at %d, so the topic was probably deleted and re-created or truncated; processing would skip its new messages. Once you have checked, reset the position (offsets.Store.Reset) to where processing should resume",
			kafkaoncetype.ErrPositionAheadOfLog, which, start, v.logEnd)}
	case startDeleted:
		return 0, w.deletedError(start, v.logStart)
	}

	var starts int
	var inProgress bool
	err := w.retryUntil(stop, "partition assignment: cannot record the start", func() (err error) {
		w.runID, starts, inProgress, w.attemptsUpTo, err = w.attempts.Assigned(work, w.db, w.cfg.Name, w.topic, w.partition, start)
		return err
	})
	if err != nil {
		return 0, err
	}
	w.started = true
	w.pace = pace.New(w.cfg.MaxBatch, w.gate)
	w.paceShown = attempts.Pace{Run: w.runID, BatchLimit: w.pace.Limit(false)}
	if startsCarefully(starts, inProgress) {
		// The previous run did not get past this offset: it may have died on
		// a message of its first batch. Go one message at a time, counting
		// attempts, so a message that kills the process is found and set
		// aside after MaxAttempts.
		w.carefulUntil = start + int64(w.cfg.MaxBatch)
		w.log.Warn("the previous run of this partition did not get past this offset; processing the next messages one at a time, counting attempts",
			w.logAttrs(slog.Int64("offset", start), slog.Int("starts", starts))...)
	}
	w.log.Info("partition assigned", w.logAttrs(slog.Int64("offset", start), slog.Int64("log_end", v.logEnd))...)
	return start, nil
}

// checkTopic compares the topic id stored with the partition's position
// with the topic's id now (current), before anything is read (see
// decideTopic): another id means the topic was deleted and created again
// since the position was stored, and the position counts offsets of the
// old topic, which would pass over the new topic's first messages. The
// partition stops with ErrTopicRecreated; the stored id stays, so every
// member and every restart stops it again until an operator acknowledges
// the re-creation (offsets.Store.TopicRecreated clears the id). A
// position with no id stored takes the topic's, from then on. The worker
// fetches the topic of id current from then on.
func (w *worker) checkTopic(stop, work context.Context, hasPos bool, stored, current kafkaclient.TopicID) error {
	w.topicID, w.topicStored = current, hasPos && !stored.IsZero()
	switch decideTopic(hasPos, stored, current) {
	case topicRecreated:
		return &kafkaoncetype.PartitionError{Topic: w.topic, Partition: w.partition, Err: fmt.Errorf(
			"%w: the stored position counts offsets of topic id %s, and the topic's id is now %s; processing from it would pass over the new topic's messages below it. Once you have checked, run kafkaonce topic-recreated (offsets.Store.TopicRecreated) with the consumer stopped",
			kafkaoncetype.ErrTopicRecreated, stored, current)}
	case topicAdopt:
		return w.retryUntil(stop, "partition assignment: cannot store the topic id", func() error { return w.storeTopic(work) })
	}
	return nil
}

// storeTopic stores w.topicID as the id of the topic the partition's
// position counts in, where it has none (see positions.QueueAdoptTopic).
func (w *worker) storeTopic(ctx context.Context) error {
	b := &pgx.Batch{}
	w.offsets.QueueAdoptTopic(b, w.cfg.Name, w.topic, w.partition, w.topicID)
	if err := w.inOneTrip(ctx, b); err != nil {
		return fmt.Errorf("offsets: store the topic id of %s/%d: %w", w.topic, w.partition, err)
	}
	w.topicStored = true
	return nil
}

// storedTopic is the topic id kept with st, zero when none is.
func storedTopic(st positions.Stored) kafkaclient.TopicID {
	if !st.TopicID.Valid {
		return kafkaclient.TopicID{}
	}
	return st.TopicID.Bytes
}

// firstStart is where a partition with neither a stored position nor a
// committed offset starts (see decideFirstStart): its log's start, or,
// at the consumer's first start on the topic under StartLatest, again is
// set once the first starts of all the topic's partitions are stored
// (topicFirstStarts): the plan is then made from the stored position.
// Under StartLatest, a partition of a topic the consumer already started
// on did not exist at that start, since that stored a position for every
// partition there was, so all of its messages came after it.
func (w *worker) firstStart(stop, work context.Context, v logView) (start int64, again bool, err error) {
	latest := w.cfg.StartOffset == kafkaoncetype.StartLatest
	var started bool
	if latest {
		err = w.retryUntil(stop, "partition assignment: cannot read the topic's positions", func() error {
			b := &pgx.Batch{}
			w.offsets.QueueTopicStarted(b, w.cfg.Name, w.topic, &started)
			if err := w.inOneTrip(work, b); err != nil {
				return fmt.Errorf("offsets: read the positions of %s: %w", w.topic, err)
			}
			return nil
		})
		if err != nil {
			return 0, false, err
		}
	}
	if decideFirstStart(latest, started) == fromLogStartRule {
		if latest {
			w.log.Info("partition added to the topic after this consumer first started on it: processing it from its log start, whatever kafkaoncetype.StartOffset says",
				w.logAttrs(slog.Int64("log_start", v.logStart))...)
		}
		return v.logStart, false, nil
	}
	err = w.retryUntil(stop, "partition assignment: cannot store the topic's first starts", func() error {
		bounds, err := w.client.TopicBounds(stop, w.topic)
		if err != nil {
			return err
		}
		committed, err := w.client.TopicCommitted(stop, w.topic, len(bounds))
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		w.offsets.QueueInitTopic(b, w.cfg.Name, w.topic, topicFirstStarts(bounds, committed), bounds[0].TopicID)
		if err := w.inOneTrip(work, b); err != nil {
			return fmt.Errorf("offsets: store the first starts of %s: %w", w.topic, err)
		}
		return nil
	})
	return 0, err == nil, err
}

// storeStart stores start as the partition's position, where it has none:
// processing begins there, and whoever processes the partition next
// resumes there too. Without it, a member that takes the partition over
// before the first batch commits would resolve FirstOffset or LastOffset
// again, against a log that has moved on: the messages retention deleted
// meanwhile, or those produced since the first start, would be skipped
// without a word. It returns the position stored: start, or the one
// another member stored first.
func (w *worker) storeStart(stop, work context.Context, start int64) (stored int64, err error) {
	err = w.retryUntil(stop, "partition assignment: cannot store the start", func() error {
		b := &pgx.Batch{}
		w.offsets.QueueInit(b, w.cfg.Name, w.topic, w.partition, start, w.topicID, &stored)
		if err := w.inOneTrip(work, b); err != nil {
			return fmt.Errorf("offsets: store the start of %s/%d: %w", w.topic, w.partition, err)
		}
		return nil
	})
	return stored, err
}

func (w *worker) loadPosition(ctx context.Context) (pos int64, has bool, err error) {
	st, err := w.loadStored(ctx)
	return st.Next, st.Found, err
}

// loadStored reads the stored position with the topic id it counts in.
func (w *worker) loadStored(ctx context.Context) (st positions.Stored, err error) {
	// One round trip, in a transaction that carries the session timeouts.
	b := &pgx.Batch{}
	w.offsets.QueueLoadStored(b, w.cfg.Name, w.topic, w.partition, &st)
	if err := w.inOneTrip(ctx, b); err != nil {
		return st, fmt.Errorf("offsets: load %s/%d: %w", w.topic, w.partition, err)
	}
	return st, nil
}

func (w *worker) deletedError(from, logStart int64) error {
	return &kafkaoncetype.PartitionError{Topic: w.topic, Partition: w.partition,
		Err: &kafkaoncetype.MessagesDeletedError{Topic: w.topic, Partition: w.partition, From: from, To: logStart - 1, LogStart: logStart}}
}

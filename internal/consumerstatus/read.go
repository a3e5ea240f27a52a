package consumerstatus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/internal/attempts"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
	"github.com/kafkaonce/kafkaonce/offsets"
)

// Read reads a consumer's report: Postgres's side first, then Kafka's for
// each topic (those with stored positions, those rec records, and extra),
// stopping asking Kafka after a failure other than a missing topic. group
// is the group whose committed offsets it reads (see GroupOf).
func Read(ctx context.Context, pool *pgxpool.Pool, admin *kafkaadmin.Admin, schemaName, consumerName, group string, rec *recorded.Settings, extra []string) (Report, error) {
	r := Report{Consumer: consumerName, Group: group, GroupType: recorded.ConsumerGroup, Schema: schemaName, Recorded: viewOf(rec)}
	share := IsShare(rec)
	if share {
		r.GroupType = recorded.ShareGroup
	}
	var err error
	if r.SchemaVersion, err = schema.Version(ctx, pool, schemaName); err != nil {
		return r, err
	}
	if r.SchemaVersion < schema.LatestVersion() {
		return r, fmt.Errorf("schema %s is at version %d, this tool needs %d: run kafkaonce migrate", schemaName, r.SchemaVersion, schema.LatestVersion())
	}
	claims, _ := dedupe.NewStore(schemaName)
	positions, _ := offsets.NewStore(schemaName)
	letters, _ := deadletter.NewStore(schemaName)
	if r.Claims, err = claims.Stats(ctx, pool, consumerName); err != nil {
		return r, err
	}
	lc, err := letters.Count(ctx, pool, consumerName)
	if err != nil {
		return r, err
	}
	r.DeadLetters, r.Pending = lc.Letters, lc.Open
	r.Retries = Retries{Waiting: lc.Waiting, NextDue: lc.NextRetry, Applied: lc.AppliedOnRetry}
	if r.Suspects, err = claims.CountSuspects(ctx, pool, consumerName); err != nil {
		return r, err
	}
	if r.Recent, err = claims.Suspects(ctx, pool, consumerName, 5); err != nil {
		return r, err
	}
	keys, _ := idempotency.NewStore(schemaName)
	counts, err := keys.Count(ctx, pool)
	if err != nil {
		return r, err
	}
	r.Keys = KeyCounts(counts)
	stored, err := positions.List(ctx, pool, consumerName)
	if err != nil {
		return r, err
	}
	tries, _ := attempts.NewStore(schemaName)
	paces, err := tries.Paces(ctx, pool, consumerName)
	if err != nil {
		return r, err
	}
	stops, err := tries.Stops(ctx, pool, consumerName)
	if err != nil {
		return r, err
	}
	holds, err := tries.Holds(ctx, pool, consumerName)
	if err != nil {
		return r, err
	}
	// Read with the rest of Postgres, before Kafka, which may use up the
	// time a page's request has.
	paused, err := readPauses(ctx, pool, schemaName, consumerName)
	if err != nil {
		return r, err
	}
	holdOf := map[string]map[int]attempts.HeldPartition{}
	for _, h := range holds {
		if holdOf[h.Topic] == nil {
			holdOf[h.Topic] = map[int]attempts.HeldPartition{}
		}
		holdOf[h.Topic][h.Partition] = h
	}
	stopOf := map[string]map[int]attempts.Stop{}
	for _, st := range stops {
		if stopOf[st.Topic] == nil {
			stopOf[st.Topic] = map[int]attempts.Stop{}
		}
		stopOf[st.Topic][st.Partition] = st
	}
	paceOf := map[string]map[int]attempts.PartitionPace{}
	for _, p := range paces {
		if paceOf[p.Topic] == nil {
			paceOf[p.Topic] = map[int]attempts.PartitionPace{}
		}
		paceOf[p.Topic][p.Partition] = p
	}
	storedAt := map[string]map[int]offsets.Position{}
	topicSet := map[string]bool{}
	for _, p := range stored {
		if storedAt[p.Topic] == nil {
			storedAt[p.Topic] = map[int]offsets.Position{}
		}
		storedAt[p.Topic][p.Partition] = p
		topicSet[p.Topic] = true
	}
	for _, t := range extra {
		topicSet[t] = true
	}
	if rec != nil {
		for _, t := range rec.Topics {
			topicSet[t] = true
		}
	}
	var topics []string
	for t := range topicSet {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	// down names the topic Kafka failed for other than by not having it:
	// each request to a cluster that does not answer waits for its
	// timeout, so the topics after it are not asked.
	down := ""
	for _, topic := range topics {
		var k topicKafka
		if down == "" {
			k = readTopicKafka(ctx, admin, group, topic, share)
		} else {
			k.unread = &Unread{Topic: topic, NotRead: slices.Clone(readsOf(share)), Error: "not asked after Kafka failed for topic " + down}
		}
		if k.unread != nil {
			r.KafkaUnread = append(r.KafkaUnread, *k.unread)
			var gone *kafkaadmin.NoTopicError
			if down == "" && !errors.As(k.err, &gone) {
				down = topic
			}
		}
		parts := k.parts
		if parts == nil {
			// The partitions Postgres knows of.
			known := map[int]bool{}
			for p := range storedAt[topic] {
				known[p] = true
			}
			for p := range paceOf[topic] {
				known[p] = true
			}
			for p := range stopOf[topic] {
				known[p] = true
			}
			for p := range holdOf[topic] {
				known[p] = true
			}
			for p := range known {
				parts = append(parts, p)
			}
			sort.Ints(parts)
		}
		for _, p := range parts {
			ps := Partition{Topic: topic, Partition: p, LogStart: -1, LogEnd: -1, Committed: -1, Stored: -1, Lag: -1}
			if b, ok := k.bounds[p]; ok {
				ps.LogStart, ps.LogEnd = b.Start, b.End
			}
			if c, ok := k.committed[p]; ok {
				ps.Committed = c
			}
			if sp, ok := k.share[p]; ok {
				start, lag := sp.Start, sp.Lag
				ps.ShareStart, ps.ShareLag = &start, &lag
			}
			if v, ok := storedAt[topic][p]; ok {
				ps.Stored = v.Next
				at := v.UpdatedAt
				ps.LastCommit = &at
			}
			if pc, ok := paceOf[topic][p]; ok {
				showPace(&ps, pc)
			}
			if st, ok := stopOf[topic][p]; ok {
				at := st.At
				ps.StoppedAt, ps.StopReason = &at, st.Reason
			}
			if h, ok := holdOf[topic][p]; ok {
				at, since := h.At, h.Since
				ps.HeldAt, ps.HeldSince = &at, &since
			}
			switch {
			case share && ps.ShareLag != nil && *ps.ShareLag >= 0:
				// A share group has no position: its lag is the broker's.
				ps.Lag = *ps.ShareLag
			case share:
			case k.bounds != nil:
				done := max(ps.Committed, ps.Stored, ps.LogStart)
				ps.Lag = max(ps.LogEnd-done, 0)
			}
			r.Partitions = append(r.Partitions, ps)
		}
	}
	switch {
	case share:
		r.Share = readShare(ctx, admin, group, down)
	case len(topics) > 0:
		r.ConsumerGroup = readGroup(ctx, admin, group, down)
	}
	addPauses(&r, paused)
	return r, nil
}

// topicKafka is Kafka's side of a topic, as far as it was read: a nil map
// was not read, and unread says what was not, and err why.
type topicKafka struct {
	parts     []int
	bounds    map[int]kafkaadmin.Bounds
	committed map[int]int64
	// share is a share group's share-partitions, for a share group.
	share  map[int]kafkaadmin.SharePartition
	unread *Unread
	err    error
}

// readTopicKafka reads a topic's partitions, their log bounds and group's
// committed offsets (a share group's share-partition offsets), stopping at
// the first failure.
func readTopicKafka(ctx context.Context, admin *kafkaadmin.Admin, group, topic string, share bool) topicKafka {
	var k topicKafka
	fail := func(read int, err error) topicKafka {
		k.err = err
		why := err.Error()
		// "context deadline exceeded" is what a client retrying a dial
		// that cannot work says: the dial's own failure says why.
		if f := admin.Client().Dials().Failing(); f != nil && (f.Cause != kafkaclient.DialFailed || errors.Is(err, context.DeadlineExceeded)) {
			why += ": cannot connect to the brokers: " + f.String()
		} else if errors.Is(err, context.DeadlineExceeded) {
			why += ": the brokers did not answer in time"
		}
		k.unread = &Unread{Topic: topic, NotRead: slices.Clone(readsOf(share)[read:]), Error: why}
		return k
	}
	parts, err := admin.Partitions(ctx, topic)
	if err != nil {
		return fail(0, err)
	}
	k.parts = parts
	if k.bounds, err = admin.LogBounds(ctx, topic, parts); err != nil {
		return fail(1, err)
	}
	if share {
		if k.share, err = admin.ShareOffsets(ctx, group, topic); err != nil {
			return fail(2, err)
		}
		return k
	}
	if k.committed, err = admin.Committed(ctx, group, topic, parts); err != nil {
		return fail(2, err)
	}
	return k
}

func showPace(ps *Partition, pc attempts.PartitionPace) {
	ps.ContentionRetries = pc.ContentionRetries
	if pc.Adapted {
		limit := pc.BatchLimit
		ps.BatchLimit = &limit
	}
	if !pc.LastContention.IsZero() {
		last := pc.LastContention
		ps.LastContention = &last
	}
	if !pc.SerializedUntil.IsZero() {
		until := pc.SerializedUntil
		ps.SerializedUntil = &until
	}
}

// Package commitmark is what kafkaonce writes into the metadata of the
// offsets it commits to Kafka: which store (the Postgres schema, by the id
// migration 019 made in store_identity) and which consumer committed the
// offset against a stored position, and where the partition's processing
// first started.
//
// The group's committed offset is only a copy of the stored position. When
// a partition has no stored position, the copy is all there is, and the
// mark says what it is a copy of: a group offset that names this store and
// this consumer was committed against a position this database held and
// has lost (a restore from a backup taken before the partition's first
// start, a row deleted), so the messages below it were processed by
// transactions that are gone and must be processed again, from First. A
// group offset without a mark, or with another store's or consumer's, was
// committed by something else (another client, an operator's reset, a
// consumer on another database): adopted as a group offset always was.
package commitmark

import (
	"strconv"
	"strings"
)

// prefix starts every mark; the version is in it, so that a later format
// is told from this one rather than misread.
const prefix = "kafkaonce/1 "

// Mark is one offset commit's metadata.
type Mark struct {
	// Store is the id of the store (store_identity.id) the offset was
	// committed against.
	Store string
	// Consumer is the consumer's Name.
	Consumer string
	// First is the offset the partition's processing first started at in
	// that store, or -1 when the committer did not know it (a consumer
	// that found a position stored by a kafkaonce older than the mark).
	First int64
}

// String is the metadata the mark is committed as. The consumer's name
// comes last, so that it needs no quoting: everything after "consumer=" is
// the name.
func (m Mark) String() string {
	return prefix + "store=" + m.Store + " first=" + strconv.FormatInt(m.First, 10) + " consumer=" + m.Consumer
}

// Parse reads a mark from an offset commit's metadata; ok is false for
// metadata that is not a mark (another client's, an empty string).
func Parse(metadata string) (m Mark, ok bool) {
	rest, ok := strings.CutPrefix(metadata, prefix)
	if !ok {
		return Mark{}, false
	}
	store, rest, ok1 := cutField(rest, "store=")
	first, rest, ok2 := cutField(rest, "first=")
	name, ok3 := strings.CutPrefix(rest, "consumer=")
	if !ok1 || !ok2 || !ok3 || store == "" || name == "" {
		return Mark{}, false
	}
	n, err := strconv.ParseInt(first, 10, 64)
	if err != nil || n < -1 {
		return Mark{}, false
	}
	return Mark{Store: store, Consumer: name, First: n}, true
}

// cutField cuts "key=value " from the start of s.
func cutField(s, key string) (value, rest string, ok bool) {
	s, ok = strings.CutPrefix(s, key)
	if !ok {
		return "", "", false
	}
	value, rest, ok = strings.Cut(s, " ")
	return value, rest, ok
}

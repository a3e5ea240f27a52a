package kafkaclient

import (
	"encoding/base64"
	"fmt"
)

// TopicID is the id Kafka gives a topic when it creates it (KIP-516): a
// topic deleted and created again under the same name has another, and
// its offsets start over. It is what tells a stored position of the old
// topic from one of the new. The zero TopicID is none: the broker gave no
// id (Kafka before 2.8).
type TopicID [16]byte

// IsZero reports whether id is none.
func (id TopicID) IsZero() bool { return id == TopicID{} }

// String is id as Kafka's tools print it: URL-safe base64 without
// padding.
func (id TopicID) String() string {
	return base64.RawURLEncoding.EncodeToString(id[:])
}

// Differs reports whether a and b are both known and not the same: a
// topic whose id is unknown on either side cannot be told apart.
func (id TopicID) Differs(other TopicID) bool {
	return !id.IsZero() && !other.IsZero() && id != other
}

// RecreatedError says that a partition's topic is not the one it was
// expected to be: its id changed, so it was deleted and created again
// under the same name. Its offsets started over and hold other messages;
// the fetcher hands out nothing of it.
type RecreatedError struct {
	Topic     string
	Partition int
	// Expected is the id the partition was opened with, Found the id the
	// broker gave since (zero: the broker no longer knows Expected and
	// gave no other).
	Expected, Found TopicID
}

func (e *RecreatedError) Error() string {
	if e.Found.IsZero() {
		return fmt.Sprintf("kafkaclient: %s/%d: the broker no longer knows topic id %s: the topic was deleted (and perhaps created again)", e.Topic, e.Partition, e.Expected)
	}
	return fmt.Sprintf("kafkaclient: %s/%d: the topic's id is %s, not %s as when the partition was opened: the topic was deleted and created again", e.Topic, e.Partition, e.Found, e.Expected)
}

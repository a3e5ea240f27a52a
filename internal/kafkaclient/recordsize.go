package kafkaclient

// MaxRecordBytes is the largest record Publish writes, as RecordBytes
// counts it. Both clients refuse a larger one themselves (ErrTooLarge)
// and write the others of the call, so the two behave the same: franz-go
// would otherwise fail it above its ProducerBatchMaxBytes (1,000,012 by
// default) and kafka-go fail the whole call above its BatchBytes (1 MiB).
// It is under the broker's default max.message.bytes (1,048,588), so a
// topic left at the default takes every record Publish sends; a topic set
// lower refuses some, with ErrTooLarge too.
const MaxRecordBytes = 1_000_000

// recordOverhead bounds what a record batch holding one record adds to
// the record's key, value and headers, however a client or the broker
// counts it: the batch's header (61 bytes; franz-go counts 65) and the
// record's own fields (its length, attributes, timestamp and offset
// deltas, and the key's, value's and header count's lengths, varints of at
// most 10 bytes each), with room to spare.
const recordOverhead = 128

// headerOverhead bounds a header's two varint lengths.
const headerOverhead = 10

// RecordBytes is the size of r as a record batch of its own, never less
// than what franz-go, kafka-go or the broker count against their limits.
func RecordBytes(r *Record) int {
	n := recordOverhead + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += HeaderBytes(len(h.Key), len(h.Value))
	}
	return n
}

// HeaderBytes is what a header with a key and a value of these lengths
// adds to RecordBytes.
func HeaderBytes(key, value int) int { return headerOverhead + key + value }

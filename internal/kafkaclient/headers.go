package kafkaclient

import "github.com/kafkaonce/kafkaonce/kafkaoncetype"

// HeaderArena hands out the header slices of records from shared blocks,
// so that a record's headers do not cost an allocation of their own. A
// block is never reused: a record's headers stay valid for as long as the
// record is referenced, whatever happens to the records after it.
type HeaderArena struct{ block []kafkaoncetype.Header }

// arenaBlock is how many headers one block holds.
const arenaBlock = 1024

// CopyHeaders returns hs as kafkaonce's headers, in a of the arena's
// blocks (nil for none). kv reads one header of the client's type.
func CopyHeaders[H any](a *HeaderArena, hs []H, kv func(*H) (string, []byte)) []kafkaoncetype.Header {
	if len(hs) == 0 {
		return nil
	}
	if len(hs) > cap(a.block)-len(a.block) {
		a.block = make([]kafkaoncetype.Header, 0, max(arenaBlock, len(hs)))
	}
	start := len(a.block)
	for i := range hs {
		k, v := kv(&hs[i])
		a.block = append(a.block, kafkaoncetype.Header{Key: k, Value: v})
	}
	// Capped, so that appending to one record's headers cannot write over
	// the next record's.
	return a.block[start:len(a.block):len(a.block)]
}

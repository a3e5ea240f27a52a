package claims

import (
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// The plain claim (every message "applied", first attempt) is the statement
// a consumer sends with every batch, so its parameters are laid out for pgx
// to copy cheaply.
//
// Passed as three arrays (text[], bytea[], bigint[]), pgx encodes them
// element by element into a parameter buffer that grows by append, a quarter
// at a time, and then copies that buffer into its write buffer: about 600
// bytes of garbage per message for batches of 1,000 messages with 36-byte
// ids, most of what the consumer allocated per message. Packed into one
// bytea built in a pooled buffer, the same data is about 80 bytes a message,
// and pgx copies it twice, each time into a buffer it allocates at the right
// size in one go: about 170 bytes per message in all. The server unpacks it
// with string_to_array and substr, which measured no slower than decoding
// the arrays (BenchmarkClaimEncoding).
//
// The packed parameter, for n claims, is
//
//	the n fingerprints, 32 bytes each;
//	the n message ids, joined by '\n', and one ',' to end them;
//	the n offsets in decimal, joined by ','
//
// with the byte positions where the ids and the offsets start (counted from
// 1, as substr counts) as two more parameters. An id that is empty or holds
// a '\n' cannot be told apart in this layout: a batch with one is claimed
// with the array statement instead.

// packedRows is the FROM item that unpacks the claims in $4 (ids from byte
// $5, offsets from byte $6) into rows c(message_id, kafka_offset, n), n
// counting from 1. kafka_offset is text: cast it.
const packedRows = `unnest(
	string_to_array(convert_from(substr($4::bytea, $5::int, $6::int - $5::int - 1), 'UTF8'), E'\n'),
	string_to_array(convert_from(substr($4::bytea, $6::int), 'UTF8'), ',')
) WITH ORDINALITY AS c(message_id, kafka_offset, n)`

// packedSelect selects the insert's rows from packedRows, in message-id
// order (see NewStore), numbering the consumer with consumerNumber.
func packedSelect(consumerNumber string) string {
	return `SELECT ` + consumerNumber + `, c.message_id, substr($4::bytea, c.n::int * 32 - 31, 32), $2, $3, c.kafka_offset::bigint
FROM ` + packedRows + `
ORDER BY c.message_id COLLATE "C", c.kafka_offset::bigint`
}

// packedClaims holds the packed parameter of one statement.
type packedClaims struct{ buf []byte }

// maxPooledPack bounds the buffers kept for reuse: a batch of long ids
// should not pin its buffer for good.
const maxPooledPack = 1 << 20

var packPool = sync.Pool{New: func() any { return new(packedClaims) }}

// packClaims packs claims, or returns false when they cannot be packed (no
// claims, or an id the layout cannot hold).
func packClaims(claims []Claim) (p *packedClaims, idsAt, offsetsAt int, ok bool) {
	if len(claims) == 0 {
		return nil, 0, 0, false
	}
	size := 0
	for i := range claims {
		id := claims[i].MessageID
		if id == "" || strings.IndexByte(id, '\n') >= 0 {
			return nil, 0, 0, false
		}
		size += len(claims[i].Fingerprint) + len(id) + 1 + 21
	}
	p = packPool.Get().(*packedClaims)
	buf := p.buf[:0]
	if cap(buf) < size {
		buf = make([]byte, 0, size)
	}
	for i := range claims {
		buf = append(buf, claims[i].Fingerprint[:]...)
	}
	idsAt = len(buf) + 1
	for i := range claims {
		if i > 0 {
			buf = append(buf, '\n')
		}
		buf = append(buf, claims[i].MessageID...)
	}
	buf = append(buf, ',') // ends the ids: the offsets start after it
	offsetsAt = len(buf) + 1
	for i := range claims {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = strconv.AppendInt(buf, claims[i].Offset, 10)
	}
	p.buf = buf
	return p, idsAt, offsetsAt, true
}

// releaseAfter wraps q's result callback (set it first) so that p goes
// back to the pool once the statement's result is read: by then pgx has encoded every
// argument of the batch. (When an earlier statement fails, the callback
// never runs and p is left to the garbage collector.) q's arguments are
// dropped at the same time, so that sending the query again fails instead
// of reading a buffer another statement may be filling.
func releaseAfter(q *pgx.QueuedQuery, p *packedClaims) {
	if p == nil {
		return
	}
	read := q.Fn
	released := false
	q.Fn = func(br pgx.BatchResults) error {
		if !released { // once: a buffer in the pool twice would be handed to two statements
			released = true
			defer p.release(q)
		}
		return read(br)
	}
}

// release unhooks p from q and returns it to the pool.
func (p *packedClaims) release(q *pgx.QueuedQuery) {
	q.Arguments = nil
	if cap(p.buf) > maxPooledPack {
		return
	}
	p.buf = p.buf[:0]
	packPool.Put(p)
}

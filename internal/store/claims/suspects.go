package claims

import (
	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/dedupe"
)

// QueueSuspects adds to b the recording of suspects of one partition.
func (s *Store) QueueSuspects(b *pgx.Batch, consumer, topic string, partition int, suspects []dedupe.Suspect) {
	n := len(suspects)
	offsets, ids, firstIDs, firstOffsets := make([]int64, n), make([]string, n), make([]string, n), make([]int64, n)
	fps, skipped := make([][]byte, n), make([]bool, n)
	for i := range suspects {
		offsets[i], ids[i], firstIDs[i], firstOffsets[i] = suspects[i].Offset, suspects[i].MessageID, suspects[i].FirstMessageID, suspects[i].FirstOffset
		fps[i], skipped[i] = suspects[i].Fingerprint[:], suspects[i].Skipped
	}
	b.Queue(`INSERT INTO `+s.suspects+` (consumer, topic, partition, kafka_offset, message_id, fingerprint, first_message_id, first_offset, skipped)
SELECT $1, $2, $3, u.o, u.id, u.fp, u.fid, u.fo, u.sk FROM unnest($4::bigint[], $5::text[], $6::bytea[], $7::text[], $8::bigint[], $9::bool[]) AS u(o, id, fp, fid, fo, sk)
ON CONFLICT DO NOTHING`, consumer, topic, partition, offsets, ids, fps, firstIDs, firstOffsets, skipped)
}

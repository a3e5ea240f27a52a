package claims

import (
	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/pgarray"
)

// ExpectFailed is the SQLSTATE of QueueExpectClaimed's statement when a
// message it names is not claimed with the given fingerprint.
const ExpectFailed = "KO002"

// QueueExpectClaimed adds to b a statement that fails with SQLSTATE
// ExpectFailed unless every ids[i] is claimed by consumer with fps[i]: the
// check for messages skipped as re-sent without claiming them. Like a
// failing claim, a failure stops a pipelined transaction before its COMMIT.
func (s *Store) QueueExpectClaimed(b *pgx.Batch, consumer string, ids []string, fps []dedupe.Fingerprint) {
	idArr := make(pgarray.Array[pgarray.Text], len(ids))
	fpArr := make(pgarray.Array[pgarray.Bytes], len(fps))
	for i := range ids {
		idArr[i] = pgarray.Text(ids[i])
		fpArr[i] = fps[i][:]
	}
	b.Queue(s.expectSQL, consumer, idArr, fpArr)
}

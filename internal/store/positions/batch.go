package positions

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/txguard"
)

// TxEnded is the SQLSTATE raised when a batch's transaction is not the one
// that opened the batch any more, or is being committed before the batch
// was closed: a statement of the handler's (a COMMIT or ROLLBACK) ended
// it. See QueueOpen.
const TxEnded = "KO003"

// QueueOpen adds to b the statement that opens a batch of the partition in
// the transaction (migration 009). Until QueueClose's statement has run in
// the same transaction, the transaction cannot commit: a COMMIT is refused
// with TxEnded and the transaction rolls back, so nothing a handler does
// can make a batch durable before the consumer closes it.
func (s *Store) QueueOpen(b *pgx.Batch, consumer, topic string, partition int) {
	b.Queue("SELECT "+s.OpenExpr(1), consumer, topic, partition)
}

// OpenExpr is QueueOpen's statement as an expression, taking parameters
// $first to $first+2: consumer, topic, partition (AdvanceChecked's first
// three), to share a SELECT with others.
func (s *Store) OpenExpr(first int) string {
	return fmt.Sprintf("%s($%d, $%d, $%d)", s.openFn, first, first+1, first+2)
}

// QueueClose adds to b the statements that close the partition's batch,
// once the handlers are done with its transaction: first the server's
// check of the session they leave (schema.AfterUserCode: it fails with
// schema.SessionChanged when a handler changed what the consumer's
// statements rely on, and puts back the role the transaction began
// with), then the closing, which fails with TxEnded when the transaction
// is not the one that opened the batch (a ROLLBACK, then statements in a
// transaction of their own). Run them after the handlers' statements and
// before the consumer's own.
func (s *Store) QueueClose(b *pgx.Batch, consumer, topic string, partition int) {
	b.Queue(s.afterUserCode)
	b.Queue("SELECT "+s.closeFn+"($1, $2, $3)", consumer, topic, partition)
}

// CommitCheck is the batch's check (see QueueOpen) as the guard around a
// handler's transaction lifts it for a SET CONSTRAINTS … IMMEDIATE, a
// legitimate early look at the handler's own deferred constraints that
// would fire the check's trigger too: the batch is closed, the statement
// runs, and the check is deferred again and the batch reopened, in one
// pipeline, as the role the transaction began with (the handler may have
// set another, which may not touch open_batches).
func (s *Store) CommitCheck(consumer, topic string, partition int) *txguard.CommitCheck {
	return &txguard.CommitCheck{
		Lift: func(b *pgx.Batch) {
			b.Queue(s.asBegan)
			b.Queue("SELECT "+s.closeFn+"($1, $2, $3)", consumer, topic, partition)
			b.Queue(s.asHandler)
		},
		Restore: func(b *pgx.Batch) {
			b.Queue(s.asBegan)
			b.Queue("SET CONSTRAINTS " + s.openCheck + " DEFERRED")
			b.Queue("SELECT "+s.openFn+"($1, $2, $3)", consumer, topic, partition)
			b.Queue(s.asHandler)
		},
	}
}

package kafkaoncetype

// Class says why a message was set aside as a dead letter. It is stored as
// text; these are the classes kafkaonce writes.
type Class string

const (
	// ClassPermanent means the handler returned an error marked permanent.
	ClassPermanent Class = "permanent"
	// ClassPanic means the handler panicked (the stack is in the letter's error).
	ClassPanic Class = "panic"
	// ClassUndecodable means the handler could not decode the payload (a JSON
	// syntax or type error).
	ClassUndecodable Class = "undecodable"
	// ClassData means Postgres rejected the data in a way that will not change
	// on retry (invalid text, out-of-range value, constraint violation).
	ClassData Class = "data"
	// ClassTxMisuse means the handler tried to commit or roll back the
	// consumer's transaction.
	ClassTxMisuse Class = "tx_misuse"
	// ClassInvalidID means no valid message id could be derived.
	ClassInvalidID Class = "invalid_id"
	// ClassConflict means the id was already claimed for different content.
	ClassConflict Class = "conflict"
	// ClassRetriesExhausted means the handler kept failing with errors that could
	// have been transient until its attempts (or their time) ran out; the
	// letter's error holds the last one.
	ClassRetriesExhausted Class = "retries_exhausted"
	// ClassRetryLater means the message was set aside to be tried again
	// later, automatically (consumer.RetryLater, Config.RetryLater): the
	// letter's RetryAt says when. A letter whose retries run out becomes
	// ClassRetriesExhausted.
	ClassRetryLater Class = "retry_later"
	// ClassCrashed means attempts of this message kept ending without a result
	// (the process died, or its connection did, while the handler ran).
	ClassCrashed Class = "crashed"
)

// Classes are every class kafkaonce writes.
var Classes = []Class{ClassPermanent, ClassPanic, ClassUndecodable, ClassData, ClassTxMisuse, ClassInvalidID,
	ClassConflict, ClassRetriesExhausted, ClassRetryLater, ClassCrashed}

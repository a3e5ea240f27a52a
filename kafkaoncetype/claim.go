package kafkaoncetype

import (
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// Fingerprint is a SHA-256 digest of a message's key and value (see
// dedupe.FingerprintOf).
type Fingerprint [sha256.Size]byte

// String returns the fingerprint in hex.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// ClaimStatus is what became of a claimed message.
type ClaimStatus string

const (
	// StatusApplied means the handler ran and its effects committed with the claim.
	StatusApplied ClaimStatus = "applied"
	// StatusDeadLettered means the message failed and was set aside.
	StatusDeadLettered ClaimStatus = "dead_lettered"
	// StatusInvalid means the message could not be processed at all (for example
	// its id could not be read).
	StatusInvalid ClaimStatus = "invalid"
	// StatusSuspectDuplicate means the message's content was seen shortly before
	// under another id and the consumer was told to skip such messages.
	StatusSuspectDuplicate ClaimStatus = "suspect_duplicate"
)

// Claim is a row of processed_messages: one message id, claimed once.
type Claim struct {
	Consumer    string
	MessageID   string
	Fingerprint Fingerprint
	Topic       string
	Partition   int
	Offset      int64
	Status      ClaimStatus
	Attempts    int
	ProcessedAt time.Time
}

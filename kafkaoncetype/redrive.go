package kafkaoncetype

import "fmt"

// RedriveResult says what a redrive of dead letters did.
type RedriveResult struct {
	// Applied counts letters whose message the handler applied.
	Applied int
	// AlreadyApplied counts letters found redriven (or settled by an
	// operator) meanwhile, or whose message id was applied in another way
	// (a later duplicate of it).
	AlreadyApplied int
	// Failed lists letters the handler (or the claim) failed for; they stay
	// dead letters.
	Failed []RedriveError
}

// RedriveError is the failure of one letter's redrive.
type RedriveError struct {
	LetterID int64
	Err      error
}

func (e RedriveError) Error() string { return fmt.Sprintf("dead letter %d: %v", e.LetterID, e.Err) }

// Unwrap returns the letter's error, for errors.Is and errors.As.
func (e RedriveError) Unwrap() error { return e.Err }

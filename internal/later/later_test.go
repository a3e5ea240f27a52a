package later

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestMarkAndAfter(t *testing.T) {
	t.Parallel()
	base := errors.New("partner down")
	if Mark(nil, time.Minute) != nil {
		t.Fatal("Mark(nil) is not nil")
	}
	marked := fmt.Errorf("sending: %w", Mark(base, time.Minute))
	d, ok := After(marked)
	if !ok || d != time.Minute {
		t.Fatalf("After(wrapped mark) = %v, %v; want 1m, true", d, ok)
	}
	if !errors.Is(marked, base) {
		t.Fatal("the mark hides the error it marks")
	}
	if _, ok := After(base); ok {
		t.Fatal("an unmarked error asks for a retry later")
	}
}

package permanent

import (
	"errors"
	"fmt"
	"testing"
)

func TestMarkAndIs(t *testing.T) {
	t.Parallel()
	cause := errors.New("rejected")
	marked := Mark(cause)
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain", cause, false},
		{"marked", marked, true},
		{"wrapped after marking", fmt.Errorf("deliver: %w", marked), true},
		{"joined with a plain error", errors.Join(errors.New("other"), marked), true},
		{"marked twice", Mark(marked), true},
	}
	for _, tc := range cases {
		if got := Is(tc.err); got != tc.want {
			t.Errorf("%s: Is = %v, want %v", tc.name, got, tc.want)
		}
	}
	if Mark(nil) != nil {
		t.Error("Mark(nil) must be nil")
	}
	if !errors.Is(marked, cause) {
		t.Error("a marked error must wrap its cause")
	}
	if got, want := marked.Error(), "permanent: rejected"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if got := Mark(marked).Error(); got != "permanent: rejected" {
		t.Errorf("marking twice changed the text: %q", got)
	}
}

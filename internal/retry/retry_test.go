package retry

import (
	"context"
	"testing"
	"time"
)

func TestFullJitterStaysUnderTheCappedEnvelope(t *testing.T) {
	t.Parallel()
	p := Policy{Initial: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	envelopes := []time.Duration{10, 20, 40, 80, 80, 80}
	// Over many sequences, each wait stays within its envelope and the
	// largest wait seen gets close to it (the jitter covers the full range).
	maxSeen := make([]time.Duration, len(envelopes))
	for range 2000 {
		b := p.New()
		for i, env := range envelopes {
			d := b.Next()
			if d < 0 || d > env*time.Millisecond {
				t.Fatalf("wait %d = %v, want within [0, %v]", i, d, env*time.Millisecond)
			}
			maxSeen[i] = max(maxSeen[i], d)
		}
	}
	for i, env := range envelopes {
		if maxSeen[i] < env*time.Millisecond*9/10 {
			t.Errorf("wait %d never came near its envelope %v (max %v): jitter is not full", i, env*time.Millisecond, maxSeen[i])
		}
	}
}

func TestResetStartsOver(t *testing.T) {
	t.Parallel()
	b := Policy{Initial: time.Millisecond, Max: time.Second}.New()
	for range 10 {
		b.Next()
	}
	b.Reset()
	if d := b.Next(); d > time.Millisecond {
		t.Fatalf("after Reset the first wait is %v, want at most 1ms", d)
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := Sleep(ctx, time.Hour); err == nil {
		t.Fatal("Sleep on a cancelled context returned nil")
	}
	if time.Since(start) > time.Second {
		t.Fatal("Sleep did not return promptly on a cancelled context")
	}
}

func TestWaitOfTheNthRetry(t *testing.T) {
	t.Parallel()
	p := Policy{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}
	for n, env := range map[int]time.Duration{1: 10, 2: 20, 3: 40, 4: 50, 30: 50} {
		for range 200 {
			if d := p.Wait(n); d < 0 || d > env*time.Millisecond {
				t.Fatalf("Wait(%d) = %v, want within [0, %v]", n, d, env*time.Millisecond)
			}
		}
	}
}

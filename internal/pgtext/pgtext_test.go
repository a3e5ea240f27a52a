package pgtext

import (
	"strings"
	"testing"
)

func TestClean(t *testing.T) {
	for in, want := range map[string]string{
		"plain":          "plain",
		"héllo":          "héllo",
		"a\x00b":         "a\uFFFDb",
		"bad \xff\xfe x": "bad \uFFFD x",
		"":               "",
	} {
		if got := Clean(in); got != want {
			t.Errorf("Clean(%q) = %q, want %q", in, got, want)
		}
		if !Storable(Clean(in)) {
			t.Errorf("Clean(%q) is not storable", in)
		}
	}
	if Storable("a\x00") || Storable("\xff") {
		t.Error("NUL and invalid UTF-8 are not storable")
	}
}

func TestCut(t *testing.T) {
	long := strings.Repeat("é", 3000) // 6000 bytes, two per character
	for _, max := range []int{4096, 4095, 16, 15, 3, 0} {
		got := Cut(long, max)
		if len(got) > max || !Storable(got) {
			t.Errorf("Cut(6000 bytes, %d) is %d bytes (storable: %v)", max, len(got), Storable(got))
		}
		if max >= len(cutMarker) && !strings.HasSuffix(got, cutMarker) {
			t.Errorf("Cut(6000 bytes, %d) does not say it was cut: %q", max, got[len(got)-20:])
		}
	}
	if got := Cut("short \xff", 100); got != "short \uFFFD" {
		t.Errorf("Cut of a short text is Clean: %q", got)
	}
}

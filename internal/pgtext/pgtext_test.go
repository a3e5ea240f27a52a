package pgtext

import "testing"

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

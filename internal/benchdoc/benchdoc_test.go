package benchdoc

import "testing"

func TestReplaceKeepsTheRestAndRoundTrips(t *testing.T) {
	doc := "# Benchmarks\n\nmain table\n"
	doc = Replace(doc, "http", "## HTTP\n\nfirst")
	if got := Section(doc, "http"); got != "<!-- begin http -->\n## HTTP\n\nfirst\n<!-- end http -->" {
		t.Fatalf("section: %q", got)
	}
	doc = Replace(doc, "http", "## HTTP\n\nsecond\n")
	want := "# Benchmarks\n\nmain table\n\n<!-- begin http -->\n## HTTP\n\nsecond\n<!-- end http -->\n"
	if doc != want {
		t.Fatalf("doc:\n%q\nwant\n%q", doc, want)
	}
	if Section("no markers here", "http") != "" {
		t.Fatal("a section found where there is none")
	}
}

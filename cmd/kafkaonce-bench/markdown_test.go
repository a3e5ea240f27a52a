package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kafkaonce/kafkaonce/internal/benchdoc"
)

// A full -markdown run rewrites BENCHMARKS.md and keeps, as they were, the
// sections the run-alone cells and kafkaonce-httpbench wrote.
func TestFullMarkdownKeepsRunAloneSections(t *testing.T) {
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	sections := []string{httpSection, outboxSection, tracingSection, clientsSection, rollingSection, shareSection, shareKafkaSection}
	for _, name := range sections {
		if err := benchdoc.Write(path, name, "## "+name+"\n\nkept figures of "+name); err != nil {
			t.Fatal(err)
		}
	}
	rep := newReport(nil, nil, options{})
	rep.machineDesc = "test machine"
	if err := rep.writeMarkdown(path, ""); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if !strings.HasPrefix(doc, "# Benchmarks") {
		t.Fatalf("not rewritten: %.80q", doc)
	}
	for _, name := range sections {
		if !strings.Contains(benchdoc.Section(doc, name), "kept figures of "+name) {
			t.Errorf("section %s dropped", name)
		}
	}
}

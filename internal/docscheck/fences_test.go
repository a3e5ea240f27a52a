package docscheck

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// pages are the Markdown pages checked, from the repository's root.
func pages(t *testing.T) []string {
	t.Helper()
	root := filepath.Join("..", "..")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := append([]string{filepath.Join(root, "README.md"), filepath.Join(root, "CHANGELOG.md"), filepath.Join(root, "BENCHMARKS.md")}, docs...)
	if len(docs) == 0 {
		t.Fatal("no pages under docs/")
	}
	return out
}

// fenceProblems returns what keeps the code blocks of a page from closing
// where they mean to: a fence line inside a block with text after the
// backticks (CommonMark takes it for code, so the block goes on), and a
// block still open at the end of the page.
func fenceProblems(lines []string) []string {
	var problems []string
	open := 0 // the line number of the open block's fence, 0 outside one
	for i, line := range lines {
		trimmed := strings.TrimLeft(line, " \t")
		if !strings.HasPrefix(trimmed, "```") {
			continue
		}
		rest := strings.TrimSpace(strings.TrimLeft(trimmed, "`"))
		switch {
		case open == 0:
			open = i + 1
		case rest == "":
			open = 0
		default:
			problems = append(problems, fmt.Sprintf("line %d: a fence with text after it (%q) inside the block opened at line %d does not close it: put the closing fence on a line of its own", i+1, rest, open))
		}
	}
	if open != 0 {
		problems = append(problems, fmt.Sprintf("the code block opened at line %d never closes", open))
	}
	return problems
}

// Every code block of every page closes, on a fence line of its own: a
// block left open renders the rest of the page as code.
func TestEveryCodeBlockCloses(t *testing.T) {
	for _, page := range pages(t) {
		t.Run(filepath.Base(page), func(t *testing.T) {
			f, err := os.Open(page)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var lines []string
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				lines = append(lines, sc.Text())
			}
			if err := sc.Err(); err != nil {
				t.Fatal(err)
			}
			for _, p := range fenceProblems(lines) {
				t.Error(p)
			}
		})
	}
}

// The check finds the shapes it is for.
func TestFenceProblemsFindsUnclosedBlocks(t *testing.T) {
	for _, c := range []struct {
		name  string
		page  string
		found bool
	}{
		{"blocks that close", "text\n```sh\ncmd\n```\nmore\n```go\nx\n```", false},
		{"a closing fence with text after it", "```sh\nkafkaonce dev\n```then run the tests\nmore", true},
		{"a block open at the end", "```sh\nkafkaonce dev\n", true},
		{"an indented block that closes", "- item\n  ```sh\n  cmd\n  ```", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := len(fenceProblems(strings.Split(c.page, "\n"))) > 0; got != c.found {
				t.Fatalf("problems found: %v, want %v", got, c.found)
			}
		})
	}
}

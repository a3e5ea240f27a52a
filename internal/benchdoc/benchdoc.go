// Package benchdoc lets several benchmark programs share BENCHMARKS.md:
// each owns a section between markers, and rewrites only its own. A
// program that writes the whole file keeps the others' sections.
package benchdoc

import (
	"errors"
	"os"
	"strings"
)

func markers(name string) (begin, end string) {
	return "<!-- begin " + name + " -->", "<!-- end " + name + " -->"
}

// Section returns the section called name of doc, markers included, or ""
// when doc has none.
func Section(doc, name string) string {
	begin, end := markers(name)
	i := strings.Index(doc, begin)
	if i < 0 {
		return ""
	}
	j := strings.Index(doc[i:], end)
	if j < 0 {
		return ""
	}
	return doc[i : i+j+len(end)]
}

// Replace returns doc with its section called name holding body, the
// section appended when doc has none.
func Replace(doc, name, body string) string {
	begin, end := markers(name)
	section := begin + "\n" + strings.TrimRight(body, "\n") + "\n" + end
	if old := Section(doc, name); old != "" {
		return strings.Replace(doc, old, section, 1)
	}
	return strings.TrimRight(doc, "\n") + "\n\n" + section + "\n"
}

// Kept reads the section called name of the file at path, for a program
// that rewrites the file: "" when there is no file or no section.
func Kept(path, name string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return Section(string(b), name)
}

// Write rewrites the section called name of the file at path to hold body,
// keeping the rest of the file (and making it when there is none).
func Write(path, name, body string) error {
	doc, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.WriteFile(path, []byte(Replace(string(doc), name, body)), 0o644)
}

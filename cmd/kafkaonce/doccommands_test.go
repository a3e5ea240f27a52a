package main

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// Every kafkaonce command the README and the docs show in a shell block
// names a command that exists, with flags it takes: a renamed flag or
// command fails here rather than in an operator's terminal during an
// incident. The commands are parsed, not run.
func TestEveryDocumentedCommandParses(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	files = append(files, "../../README.md")
	var checked int
	for _, file := range files {
		for _, c := range shellCommands(t, file) {
			t.Run(filepath.Base(file)+":"+c.line, func(t *testing.T) {
				root, _ := newRootSettings(streams{getenv: func(string) string { return "" }, terminal: func() bool { return false }})
				cmd, rest, err := root.Find(c.args)
				require.NoError(t, err, "%s: no such command", c.text)
				if i := indexOf(rest, "--"); i >= 0 {
					rest = rest[:i] // what dev runs, not its flags
				}
				if err := cmd.ParseFlags(rest); !errors.Is(err, pflag.ErrHelp) {
					require.NoError(t, err, "%s", c.text)
				}
				if args := cmd.Flags().Args(); cmd.Args != nil {
					require.NoError(t, cmd.Args(cmd, args), "%s", c.text)
				}
			})
			checked++
		}
	}
	require.Greater(t, checked, 30, "the docs' commands were not found")
}

// docCommand is a kafkaonce command found in a doc's shell block.
type docCommand struct {
	line string   // file line number, for the subtest's name
	text string   // as written
	args []string // after "kafkaonce"
}

// shellCommands returns the kafkaonce commands of file's sh blocks: the
// words after "kafkaonce" (or "go run ./cmd/kafkaonce") where it starts a
// command (first on the line, after VAR=value assignments, or in "$(…)"),
// up to a comment, a pipe or the end of a command substitution. A line
// ending in a backslash goes on on the next. A synopsis's optional parts
// count as given, with their first alternative: [--from earliest|OFFSET]
// is --from earliest.
func shellCommands(t *testing.T, file string) []docCommand {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	var out []docCommand
	inShell := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			inShell = !inShell && (trimmed == "```sh" || trimmed == "```bash" || trimmed == "```shell")
			continue
		}
		if !inShell {
			continue
		}
		for strings.HasSuffix(trimmed, "\\") && sc.Scan() {
			n++
			trimmed = strings.TrimSuffix(trimmed, "\\") + " " + strings.TrimSpace(sc.Text())
		}
		words := shellWords(synopsis(trimmed))
		for i, w := range words {
			switch {
			case w == "kafkaonce" && startsCommand(words[:i]):
			case w == "./cmd/kafkaonce" && i >= 2 && words[i-1] == "run" && words[i-2] == "go" && startsCommand(words[:i-2]):
			default:
				continue
			}
			var args []string
			for _, a := range words[i+1:] {
				if a == "|" || a == ")" || strings.HasPrefix(a, "#") || a == "&&" || a == ";" {
					break
				}
				args = append(args, a)
			}
			out = append(out, docCommand{line: strings.TrimSpace(strings.SplitN(filepath.Base(file), ".", 2)[0]) + "_" + strconv.Itoa(n), text: trimmed, args: args})
			break
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// startsCommand reports whether a word after before starts a command.
func startsCommand(before []string) bool {
	if len(before) > 0 && before[len(before)-1] == "$(" {
		return true
	}
	for _, w := range before {
		if name, _, ok := strings.Cut(w, "="); !ok || name == "" || strings.ToUpper(name) != name {
			return false
		}
	}
	return true
}

// synopsis makes a usage line a command: brackets dropped, and of
// alternatives a|b the first kept.
func synopsis(line string) string {
	if !strings.Contains(line, "[") {
		return line
	}
	words := strings.Fields(strings.NewReplacer("[", "", "]", "").Replace(line))
	for i, w := range words {
		if first, _, ok := strings.Cut(w, "|"); ok {
			words[i] = first
		}
	}
	return strings.Join(words, " ")
}

// shellWords splits a line of shell into words, as far as the docs need:
// single and double quotes, "$(" and ")" as words of their own, and a
// comment from " #" on.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	flush := func() {
		if inWord {
			words = append(words, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	rs := []rune(line)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote == '"' && r == '$' && i+1 < len(rs) && rs[i+1] == '(':
			flush()
			words = append(words, "$(")
			i++
		case quote == '"' && r == ')':
			flush()
			words = append(words, ")")
		case quote != 0:
			cur.WriteRune(r)
			inWord = true
		case r == '\'' || r == '"':
			quote = r
			inWord = true
		case r == '#' && !inWord:
			flush()
			return append(words, "#")
		case r == ' ' || r == '\t':
			flush()
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	flush()
	return words
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

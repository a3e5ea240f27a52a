package main

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// jsonKeys collects the object keys of v, at every depth, that are not
// snake_case, with where they are.
func jsonKeys(v any, at string, bad *[]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if !snakeCase.MatchString(k) {
				*bad = append(*bad, at+"."+k)
			}
			jsonKeys(e, at+"."+k, bad)
		}
	case []any:
		for i, e := range x {
			jsonKeys(e, at+"["+strconv.Itoa(i)+"]", bad)
		}
	}
}

// Every command's --json output follows one convention: snake_case keys,
// at every depth (see "JSON output" in docs/operations.md).
func TestEveryJSONOutputIsSnakeCase(t *testing.T) {
	t.Parallel()
	w := newPoisoned(t)
	letter := strconv.FormatInt(w.letterID("bad1"), 10)
	_, errOut, code := w.cli("pause", "--consumer", w.name, "--topic", w.topic, "--reason", "json")
	require.Equal(t, 0, code, errOut)
	for _, args := range [][]string{
		{"migrate"},
		{"status", "--consumer", w.name},
		{"audit", "--consumer", w.name},
		{"replay", "--consumer", w.name, "--to", "earliest", "--dry-run"},
		{"positions", "reset", "--consumer", w.name, "--to", "earliest", "--dry-run"},
		{"positions", "forget", "--consumer", w.name, "--dry-run"},
		{"dead-letters", "list", "--consumer", w.name},
		{"dead-letters", "show", letter},
		{"dead-letters", "redrive", "--consumer", w.name, letter},
		{"dead-letters", "settle", "--consumer", w.name, letter},
		{"pause", "--consumer", w.name},
		{"resume", "--consumer", w.name},
		{"prune", "--consumer", w.name, "--older-than", "720h", "--dry-run"},
		{"keys", "prune", "--dry-run"},
		{"outbox", "parked"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out, errOut, code := w.cli(append([]string{"--json"}, args...)...)
			require.Contains(t, []int{0, 1}, code, errOut)
			var v any
			require.NoError(t, json.Unmarshal([]byte(out), &v), out)
			var bad []string
			jsonKeys(v, "", &bad)
			require.Empty(t, bad, "keys that are not snake_case in:\n%s", out)
		})
	}
}

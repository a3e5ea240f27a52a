// Package examples_test checks that every example builds, and the quickstart
// runs, when copied into a module of its own: examples import only
// kafkaonce's public packages, so a user can start from any of them.
package examples_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// checkout is the root of the kafkaonce module under test.
func checkout(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

// newModule writes a module named module in a temp dir with the given Go
// files, requiring kafkaonce from the checkout, and tidies it. nested are
// kafkaonce's nested modules the files import (as "devenv/containers"),
// also taken from the checkout.
func newModule(t *testing.T, module string, files map[string][]byte, nested ...string) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), src, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gomod := "module " + module + "\n\ngo " + strings.TrimPrefix(runtime.Version(), "go") + "\n\n" +
		"require github.com/kafkaonce/kafkaonce v0.0.0\n\n" +
		"replace github.com/kafkaonce/kafkaonce => " + checkout(t) + "\n"
	for _, n := range nested {
		gomod += "\nreplace github.com/kafkaonce/kafkaonce/" + n + " => " + filepath.Join(checkout(t), n) + "\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	goCmd(t, dir, "mod", "tidy")
	return dir
}

func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	// A go.work around the checkout, or -mod=vendor, must not hide what a
	// user's module would see.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go %s in a copy of the example: %v\n%s%s", strings.Join(args, " "), err, out, stderr)
	}
	return string(out)
}

// exampleFiles reads the example's Go files (not its tests).
func exampleFiles(t *testing.T, name string) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(name, "*.go"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no Go files in examples/%s: %v", name, err)
	}
	files := map[string][]byte{}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(p)] = src
	}
	return files
}

func TestEveryExampleBuildsInAModuleOfItsOwn(t *testing.T) {
	if testing.Short() {
		t.Skip("builds five modules: skipped with -short")
	}
	dirs, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		t.Run(d.Name(), func(t *testing.T) {
			// An import of kafkaonce/internal fails here: Go refuses it
			// from outside the kafkaonce module.
			dir := newModule(t, "example.com/copied/"+d.Name(), exampleFiles(t, d.Name()))
			goCmd(t, dir, "build", "-o", os.DevNull, ".")
		})
	}
}

// TestTheQuickstartRunsCopiedAsItIs is the promise of the README: copy
// examples/quickstart into a new module and `go run .` with no setup.
func TestTheQuickstartRunsCopiedAsItIs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a module: skipped with -short")
	}
	dir := newModule(t, "example.com/copied/quickstart", exampleFiles(t, "quickstart"))
	out := goCmd(t, dir, "run", ".", "-messages", "200")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var s struct {
		Applied int  `json:"applied"`
		OK      bool `json:"ok"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil {
		t.Fatalf("last line is not the JSON summary: %v\n%s", err, out)
	}
	if !s.OK || s.Applied != 200 {
		t.Fatalf("the copied quickstart did not apply its 200 credits once each:\n%s", out)
	}
}

// TestContainersAreOptIn measures the go.mod of a copied quickstart and of
// a module that runs its tests in containers: testcontainers and the
// Docker client reach the second alone.
func TestContainersAreOptIn(t *testing.T) {
	if testing.Short() {
		t.Skip("tidies two modules: skipped with -short")
	}
	quickstart := newModule(t, "example.com/copied/quickstart", exampleFiles(t, "quickstart"))
	src := `package withcontainers

import (
	"testing"

	"github.com/kafkaonce/kafkaonce/devenv"
	"github.com/kafkaonce/kafkaonce/devenv/containers"
)

func TestMain(m *testing.M) { devenv.Main(m, devenv.WithContainers(containers.Docker{})) }
`
	withContainers := newModule(t, "example.com/withcontainers", map[string][]byte{"main_test.go": []byte(src)}, "devenv/containers")
	for _, m := range []struct {
		name, dir  string
		containers bool
	}{{"a copied quickstart", quickstart, false}, {"a module testing in containers", withContainers, true}} {
		gomod, err := os.ReadFile(filepath.Join(m.dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		all := strings.Fields(goCmd(t, m.dir, "list", "-m", "-f", "{{.Path}}", "all"))
		holds := slices.ContainsFunc(all, func(p string) bool { return strings.HasPrefix(p, "github.com/testcontainers/") })
		if holds != m.containers {
			t.Errorf("%s: testcontainers in its module graph: %v, want %v", m.name, holds, m.containers)
		}
		t.Logf("%s: go.mod of %d lines; go list -m all: %d modules", m.name, strings.Count(string(gomod), "\n"), len(all))
	}
}

// TestTheTestHelpersStayLight measures what a user's go.mod gains from
// testing a handler: a module whose test imports consumer, consumertest
// and devenv. Heavy dependencies the library needs only for its own tests
// and tools (containers, browsers, telemetry, the CLI's) must not reach it.
func TestTheTestHelpersStayLight(t *testing.T) {
	if testing.Short() {
		t.Skip("tidies a module: skipped with -short")
	}
	src := `package light

import (
	"testing"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/consumer/consumertest"
	"github.com/kafkaonce/kafkaonce/devenv"
)

func TestHandler(t *testing.T) {
	_ = consumer.Config{}
	_ = consumertest.NewMessage(nil)
	_ = devenv.ForTest
}
`
	dir := newModule(t, "example.com/light", map[string][]byte{"light_test.go": []byte(src)})
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	requires := 0
	for _, line := range strings.Split(string(gomod), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasSuffix(line, "// indirect") || strings.HasPrefix(line, "require github.com/kafkaonce/kafkaonce") || strings.HasPrefix(line, "github.com/kafkaonce/kafkaonce ") {
			requires++
		}
		for _, heavy := range []string{"testcontainers", "docker", "moby", "opentelemetry", "chromedp", "prometheus", "cobra", "testify"} {
			if strings.Contains(line, heavy) {
				t.Errorf("a module testing a handler requires %q:\n%s", line, gomod)
			}
		}
	}
	t.Logf("go.mod of a module testing a handler: %d lines, %d requirements", strings.Count(string(gomod), "\n"), requires)
	requireNoHeavyModules(t, dir)
}

// TestTheLibraryModuleIsLight: a module that imports only consumer has,
// in its whole module graph (go list -m all, not only its go.mod), none of
// the modules kafkaonce's tools, plugins and benchmarks need: they are
// modules of their own.
func TestTheLibraryModuleIsLight(t *testing.T) {
	if testing.Short() {
		t.Skip("tidies a module: skipped with -short")
	}
	src := `package worker

import "github.com/kafkaonce/kafkaonce/consumer"

var _ = consumer.Config{}
`
	dir := newModule(t, "example.com/worker", map[string][]byte{"worker.go": []byte(src)})
	requireNoHeavyModules(t, dir)
}

// requireNoHeavyModules fails when the module graph of the module in dir
// holds a module of kafkaonce's CLI (cobra, chromedp), its plugins
// (Prometheus, the OpenTelemetry SDK) or containers.
func requireNoHeavyModules(t *testing.T, dir string) {
	t.Helper()
	all := strings.Fields(goCmd(t, dir, "list", "-m", "-f", "{{.Path}}", "all"))
	for _, m := range all {
		for _, heavy := range []string{"github.com/spf13/cobra", "github.com/chromedp/", "github.com/prometheus/",
			"go.opentelemetry.io/otel/sdk", "go.opentelemetry.io/contrib/", "github.com/testcontainers/", "github.com/docker/"} {
			if strings.HasPrefix(m, heavy) {
				t.Errorf("the module graph of a module importing kafkaonce holds %s", m)
			}
		}
	}
	t.Logf("go list -m all: %d modules", len(all))
}

package containers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
)

// checkChildEnv, set in a child process of the test binary, makes
// TestCheckChild run Check once and print what it returned. testcontainers
// finds the engine once per process, so each scenario gets a process of
// its own.
const checkChildEnv = "KAFKAONCE_CONTAINERS_CHECK_CHILD"

func TestCheckChild(t *testing.T) {
	if os.Getenv(checkChildEnv) == "" {
		t.Skip("runs only as the child of TestCheck")
	}
	start := time.Now()
	err := Docker{}.Check(context.Background())
	fmt.Printf("elapsed=%v\n", time.Since(start))
	fmt.Printf("error=%v\n", err)
	if err != nil && !errors.Is(err, ErrSkipped) {
		fmt.Println("not ErrSkipped")
	}
	// Asked again, with the engine turned off: the first answer stands.
	os.Setenv("KAFKAONCE_DOCKER", "off")
	fmt.Printf("again=%v\n", Docker{}.Check(context.Background()))
}

// checkResult is what a child printed.
type checkResult struct {
	elapsed    time.Duration
	err, again string
	notSkipped bool
	output     string
}

// runCheck runs Check in a child process whose environment is the test's
// with env added, and HOME a directory of the test's own holding
// properties (testcontainers' ~/.testcontainers.properties; "" for none).
func runCheck(t *testing.T, properties string, env ...string) checkResult {
	t.Helper()
	home := t.TempDir()
	if properties != "" {
		if err := os.WriteFile(filepath.Join(home, ".testcontainers.properties"), []byte(properties), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCheckChild$", "-test.v")
	cmd.Env = append(os.Environ(), checkChildEnv+"=1", "HOME="+home, "KAFKAONCE_DOCKER=")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the child failed: %v\n%s", err, out)
	}
	r := checkResult{output: string(out)}
	for _, line := range strings.Split(string(out), "\n") {
		switch k, v, _ := strings.Cut(line, "="); k {
		case "elapsed":
			r.elapsed, _ = time.ParseDuration(v)
		case "error":
			r.err = v
		case "again":
			r.again = v
		case "not ErrSkipped":
			r.notSkipped = true
		}
	}
	if r.err == "" {
		t.Fatalf("the child printed no answer:\n%s", out)
	}
	return r
}

// hungEngine is an engine that accepts connections and never answers, as
// one that hangs (or a DOCKER_HOST whose tunnel is stuck) does.
func hungEngine(t *testing.T) string {
	t.Helper()
	silent, err := faultproxy.StartSilent()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	return silent.Addr()
}

func TestCheck(t *testing.T) {
	t.Parallel()

	t.Run("KAFKAONCE_DOCKER=off skips without asking", func(t *testing.T) {
		t.Parallel()
		// The properties point at an engine that hangs: asking it would
		// take the whole bound.
		r := runCheck(t, "tc.host=tcp://"+hungEngine(t)+"\n", "KAFKAONCE_DOCKER=off")
		if r.err != "containers skipped: KAFKAONCE_DOCKER=off" || r.notSkipped {
			t.Fatalf("Check = %q, want the skip for KAFKAONCE_DOCKER=off:\n%s", r.err, r.output)
		}
		if r.elapsed > time.Second {
			t.Fatalf("Check asked something for %v with KAFKAONCE_DOCKER=off", r.elapsed)
		}
	})

	t.Run("an engine that hangs costs the bound and no more", func(t *testing.T) {
		t.Parallel()
		addr := hungEngine(t)
		r := runCheck(t, "tc.host=tcp://"+addr+"\n")
		want := "containers skipped: the container engine did not answer within " + CheckBound.String()
		if !strings.HasPrefix(r.err, want) || r.notSkipped {
			t.Fatalf("Check = %q, want it to start with %q:\n%s", r.err, want, r.output)
		}
		if r.elapsed > CheckBound+2*time.Second {
			t.Fatalf("Check returned after %v, past its bound of %v", r.elapsed, CheckBound)
		}
		if r.again != r.err {
			t.Fatalf("asked again, Check = %q; want the first answer, %q", r.again, r.err)
		}
	})

	t.Run("without an engine the answer comes at once and says why", func(t *testing.T) {
		t.Parallel()
		r := runCheck(t, "", "DOCKER_HOST=", "TESTCONTAINERS_DOCKER_SOCKET_OVERRIDE=")
		if r.err == "<nil>" {
			t.Skip("a container engine answers on this machine")
		}
		if !strings.HasPrefix(r.err, "containers skipped: no container engine found (testcontainers: ") || r.notSkipped {
			t.Fatalf("Check = %q, want the skip saying no engine was found:\n%s", r.err, r.output)
		}
		if r.elapsed > CheckBound {
			t.Fatalf("Check took %v on a machine without an engine", r.elapsed)
		}
		if r.again != r.err {
			t.Fatalf("asked again, Check = %q; want the first answer, %q", r.again, r.err)
		}
	})
}

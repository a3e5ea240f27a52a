// Package pgcluster starts a throwaway PostgreSQL server from the binaries
// installed on the machine (initdb, pg_ctl). Tests and the examples use it
// when DATABASE_URL is not set.
//
// Postgres refuses to run as root, so when the process is root the server is
// initialised and started as the "postgres" OS user, with the data directory
// handed over to that user.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Cluster is a running throwaway server.
type Cluster struct {
	dir  string
	bin  string
	port int
	cred *syscall.Credential
	// opts are the server options given at start, given again on restart.
	opts string
}

// ErrNoBinaries is returned when initdb and pg_ctl cannot be found.
var ErrNoBinaries = errors.New("pgcluster: PostgreSQL server binaries (initdb, pg_ctl) not found; install PostgreSQL (e.g. apt-get install postgresql) or set DATABASE_URL")

// ownerFile names the file, in a cluster's directory, holding the pid of the
// process that started it.
const ownerFile = "owner.pid"

// Start initialises a fresh data directory under the system temp dir and
// starts a server listening on 127.0.0.1 at a free port (or at the port
// settings name, "port"). Clusters left
// running by processes that died without stopping them (a test binary that
// panicked, say) are stopped first. settings are extra
// server settings (name → value) added to the defaults, which favour speed
// over durability: this server is for tests and demos only.
func Start(ctx context.Context, settings map[string]string) (*Cluster, error) {
	bin, err := findBinDir()
	if err != nil {
		return nil, err
	}
	cred, owner, err := serverUser()
	if err != nil {
		return nil, err
	}
	stopOrphans(bin, cred)
	dir, err := os.MkdirTemp("", "kafkaonce-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if owner != nil {
		if err := os.Chown(dir, owner[0], owner[1]); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgcluster: hand %s to the postgres user: %w", dir, err)
		}
	}
	c := &Cluster{dir: dir, bin: bin, cred: cred}
	if err := c.run(ctx, "initdb", "-D", c.dataDir(), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	port, err := freePort()
	if p, ok := settings["port"]; ok {
		port, err = strconv.Atoi(p)
		if err != nil || port <= 0 || port > 65535 {
			err = fmt.Errorf("pgcluster: port %q is not a TCP port", p)
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c.port = port
	opts := map[string]string{
		"port":                    strconv.Itoa(port),
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": dir,
		"max_connections":         "300",
		"fsync":                   "off",
		"synchronous_commit":      "off",
		"full_page_writes":        "off",
	}
	for k, v := range settings {
		opts[k] = v
	}
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var o bytes.Buffer
	for _, k := range keys {
		fmt.Fprintf(&o, " -c %s=%s", k, opts[k])
	}
	c.opts = o.String()
	if err := c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-l", filepath.Join(dir, "server.log"), "-o", c.opts, "-w", "-t", "60", "start"); err != nil {
		c.removeDir()
		return nil, err
	}
	return c, nil
}

// URL is a connection string for the cluster's postgres database.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Port is the TCP port the server listens on.
func (c *Cluster) Port() int { return c.port }

// Stop shuts the server down at once and deletes its data directory.
func (c *Cluster) Stop() error {
	err := c.run(context.Background(), "pg_ctl", "-D", c.dataDir(), "-m", "immediate", "-w", "stop")
	c.removeDir()
	return err
}

// Restart stops the server without a clean shutdown (as a crash would) and
// starts it again on the same port with the same data.
func (c *Cluster) Restart(ctx context.Context) error {
	if err := c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-m", "immediate", "-w", "stop"); err != nil {
		return err
	}
	return c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-l", filepath.Join(c.dir, "server.log"), "-o", c.opts, "-w", "-t", "60", "start")
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }

func (c *Cluster) removeDir() { _ = os.RemoveAll(c.dir) }

func (c *Cluster) run(ctx context.Context, tool string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, tool), args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	// pg_ctl start leaves the server running with our stdout inherited when
	// given a pipe; a file keeps the call from blocking on the server.
	out, err := os.CreateTemp("", "kafkaonce-pgctl-")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		text, _ := os.ReadFile(out.Name())
		logTail, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
		if len(logTail) > 2000 {
			logTail = logTail[len(logTail)-2000:]
		}
		return fmt.Errorf("pgcluster: %s: %w\n%s\n%s", tool, err, text, logTail)
	}
	return nil
}

// stopOrphans stops and removes clusters whose owner process is gone.
func stopOrphans(bin string, cred *syscall.Credential) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "kafkaonce-pg-*"))
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not ours, or still being set up
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
			continue // the owner is alive
		}
		c := &Cluster{dir: dir, bin: bin, cred: cred}
		_ = c.run(context.Background(), "pg_ctl", "-D", c.dataDir(), "-m", "immediate", "-w", "stop")
		c.removeDir()
	}
}

// findBinDir looks for initdb on PATH, then in Debian's and the common
// PostgreSQL install locations, newest major version first.
func findBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	candidates, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	more, _ := filepath.Glob("/usr/local/pgsql*/bin/initdb")
	candidates = append(candidates, more...)
	more, _ = filepath.Glob("/opt/homebrew/opt/postgresql*/bin/initdb")
	candidates = append(candidates, more...)
	sort.Sort(sort.Reverse(sort.StringSlice(candidates)))
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			return filepath.Dir(c), nil
		}
	}
	return "", ErrNoBinaries
}

// serverUser returns the credentials to run the server with: none when we are
// not root, the "postgres" user's when we are.
func serverUser() (*syscall.Credential, *[2]int, error) {
	if os.Geteuid() != 0 {
		return nil, nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, nil, fmt.Errorf("pgcluster: running as root, and Postgres refuses root; create a \"postgres\" OS user or set DATABASE_URL: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, &[2]int{uid, gid}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

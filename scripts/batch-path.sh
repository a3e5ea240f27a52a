#!/usr/bin/env bash
# Follows one batch through the code, from the fetch to the hand-off to the
# offset committer, and counts the files it visits: every entry into a
# file, and every return to a file it had already left. It runs a
# one-message batch (a Handler, claim first) under Delve's function tracer
# and maps each call of the module's packages to its source file.
#
#   DATABASE_URL=... scripts/batch-path.sh [TREE]    # TREE: a checkout, default .
#
# Needs dlv (go install github.com/go-delve/delve/cmd/dlv@latest) and
# python3. "engine spine" counts only the consumer and engine files, the
# way the layout is read; "all" also counts the helpers they call (stores,
# the handler watchdog, the transaction guard, pacing, fetching). Only the
# batch's own goroutines count (the worker's and its transaction
# attempt's), so the committer's and the maintenance loop's calls that
# happen to run meanwhile do not.
set -euo pipefail
tree=$(cd "${1:-.}" && pwd)
: "${DATABASE_URL:?set DATABASE_URL to a Postgres the tests may use}"
dlv=$(command -v dlv || echo "$(go env GOPATH)/bin/dlv")
work=$(mktemp -d)
trap 'rm -rf "$work" "$tree/consumer/zz_batchpath_test.go"' EXIT

cat >"$tree/consumer/zz_batchpath_test.go" <<'GO'
package consumer_test

import (
	"testing"
	"time"
)

func TestZZOneBatchPath(t *testing.T) {
	e := setup(t, 1)
	e.produceIDs("p", 1)
	r := e.start(e.config(e.applyHandler()))
	e.waitCommitted(map[int]int64{0: 1}, 60*time.Second)
	r.stop()
}
GO

pkgs='kafkaonce/(consumer|internal/engine|internal/store/[a-z]+|dedupe|offsets|deadletter|internal/kafkafetch|internal/usercall|internal/pace|internal/attempts|internal/recent|internal/txguard|internal/pipetx)\.'
(cd "$tree" && "$dlv" trace --test ./consumer "$pkgs" -- -test.run TestZZOneBatchPath -test.count=1) >"$work/trace.txt" 2>&1

python3 - "$tree" "$work/trace.txt" <<'PY'
import glob, os, re, sys
tree, trace = sys.argv[1], sys.argv[2]
mod = 'github.com/kafkaonce/kafkaonce/'
where = {}
for f in glob.glob(tree + '/**/*.go', recursive=True):
    if f.endswith('_test.go'):
        continue
    rel = os.path.relpath(f, tree)
    for line in open(f):
        m = re.match(r'func (?:\(\w+ \*?(\w+)(?:\[[^\]]*\])?\) )?(\w+)', line)
        if m:
            where[(os.path.dirname(rel), (m.group(1) + '.' if m.group(1) else '') + m.group(2))] = rel
calls = []
for line in open(trace):
    m = re.match(r'> goroutine\((\d+)\): ' + re.escape(mod) + r'([\w/]+)\.(.*)', line)
    if not m:
        continue
    gid, pkg, rest = m.groups()
    rest = re.sub(r'^\(\*?(\w+)(\[[^\]]*\])?\)\.', r'\1.', rest)
    rest = re.sub(r'\[go\.shape[^\]]*\]', '', rest)
    parts = [p for p in re.match(r'[\w.]+', rest).group(0).split('.') if not re.match(r'(func|deferwrap|gowrap)\d+$', p)]
    name = '.'.join(parts[:2])
    f = where.get((pkg, name)) or where.get((pkg, parts[-1]))
    if f:  # not an interface method's wrapper, which is no code of ours
        calls.append((gid, name, f))
start = next(i for i, c in enumerate(calls) if c[1].endswith('processBatch'))
start = max(i for i in range(start + 1) if calls[i][1].endswith('fetchAndProcess'))
end = next(i for i in range(start, len(calls)) if calls[i][1] == 'committer.mark')
# The batch's own goroutines: the partition's worker, and the goroutine
# each transaction attempt runs on. The committer's loop, the maintenance
# loop and the group's run beside them and are left out.
batch = {calls[start][0]} | {g for g, n, _ in calls[start:end + 1] if n == 'txAttempt.tx'}
def count(files):
    seq = []
    for f in files:
        if not seq or seq[-1] != f:
            seq.append(f)
    seen, back = set(), 0
    for f in seq:
        back += f in seen
        seen.add(f)
    return seq, seen, back
window = [f for g, n, f in calls[start:end + 1] if g in batch and 'kafkaLogger' not in n]
for label, files in (('all', window), ('engine spine', [f for f in window if f.startswith(('consumer/', 'internal/engine/'))])):
    seq, seen, back = count(files)
    print(f'{label}: {len(seq)} steps, {len(seen)} files in {len({os.path.dirname(f) for f in seen})} packages, {back} returns to a file already left')
    print('  ' + ' -> '.join(os.path.basename(f) for f in seq))
PY

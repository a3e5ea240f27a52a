package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

// actFlags are the flags of a command that changes where a consumer group
// reads (replay, positions): it shows its plan, then acts only once the
// group is stopped and the operator agreed. One set of checks, so that no
// such command is laxer than another.
type actFlags struct {
	yes, force, dryRun bool
}

// register adds --yes, --force (force says what it risks) and --dry-run.
func (f *actFlags) register(cmd *cobra.Command, force string) {
	cmd.Flags().BoolVar(&f.yes, "yes", false, "do not ask for confirmation")
	cmd.Flags().BoolVar(&f.force, "force", false, force)
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "only show what would happen")
}

// actGate is what a command checks once its plan is shown.
type actGate struct {
	group   string
	members int
	// forced says, after "or pass --force", what --force does here.
	forced string
	// verb names the change for the --yes error ("rewind"), question asks
	// for it on a terminal.
	verb, question string
}

// clearToAct reports whether the command acts on its plan: not with
// --dry-run; not while the group has active members (they would go on
// from where they are, or Kafka refuses), unless --force; and only with
// --yes or a confirmation on a terminal.
func (s *settings) clearToAct(f actFlags, g actGate) (bool, error) {
	switch {
	case f.dryRun:
		return false, nil
	case g.members > 0 && !f.force:
		return false, fmt.Errorf("group %s has %d active member(s): stop the consumers first (or pass --force; %s)", g.group, g.members, g.forced)
	case !f.yes && !s.st.terminal():
		return false, fmt.Errorf("not a terminal: pass --yes to %s without a confirmation", g.verb)
	case !f.yes && !confirm(s.st, g.question):
		return false, errors.New("not confirmed; nothing changed")
	}
	return true, nil
}

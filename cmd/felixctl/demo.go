package main

import (
	"fmt"
	"os"
	"time"

	"github.com/felix-broker/felix/internal/demo"
)

type demoCmd struct {
	Tmux    bool          `help:"Tell the story in three tmux panes: the cluster (felixctl dev), a subscriber attached to the owner, and a publisher choosing which broker to publish through."`
	Fast    bool          `help:"Tell it without pauses, in a few seconds (for tests, and for a second viewing)."`
	Pace    time.Duration `help:"Pause between the scenes of the story, so a person can follow it: the default makes it about 45 seconds." default:"6s"`
	Hold    time.Duration `help:"With --tmux: keep the panes this long once the story is told, then tear down (0: until you detach or press Ctrl-C here)." default:"0"`
	Attach  bool          `help:"With --tmux: attach this terminal to the session (--no-attach leaves it detached; attach with the command printed)." default:"true" negatable:""`
	Socket  string        `help:"With --tmux: name of the private tmux server socket (tmux -L)." default:"felix-demo"`
	Session string        `help:"With --tmux: tmux session name." default:"felix-demo"`
}

// pace is the pause between scenes: none with --fast.
func (d *demoCmd) pace() time.Duration {
	if d.Fast {
		return 0
	}
	return d.Pace
}

func (d *demoCmd) Run(a *app) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("cannot find felixctl's own executable to run the brokers with: %w", err)
	}
	if d.Tmux {
		return d.runTmux(a, self)
	}
	_, err = demo.Run(a.ctx, a.stdout, demo.Options{Binary: self, Pause: d.pace(), Logger: a.log})
	if err != nil && a.ctx.Err() != nil {
		return fmt.Errorf("demo interrupted; its cluster was stopped and removed")
	}
	return err
}

package main

import (
	"fmt"
	"os"
	"time"

	"github.com/felix-broker/felix/internal/demo"
)

type demoCmd struct {
	Tmux    bool          `help:"Tell the story in three tmux panes, as in the demo video: the cluster, a subscriber attached to the owner, and a publisher choosing which broker to publish through."`
	Pace    time.Duration `help:"Pause between the scenes of the story." default:"500ms"`
	Hold    time.Duration `help:"With --tmux: keep the panes this long once the story is told, then tear down (0: until you detach or press Ctrl-C here)." default:"0"`
	Attach  bool          `help:"With --tmux: attach this terminal to the session (--no-attach leaves it detached; attach with the command printed)." default:"true" negatable:""`
	Socket  string        `help:"With --tmux: name of the private tmux server socket (tmux -L)." default:"felix-demo"`
	Session string        `help:"With --tmux: tmux session name." default:"felix-demo"`
}

func (d *demoCmd) Run(a *app) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("cannot find felixctl's own executable to run the brokers with: %w", err)
	}
	if d.Tmux {
		return d.runTmux(a, self)
	}
	_, err = demo.Run(a.ctx, a.stdout, demo.Options{Binary: self, Pause: d.Pace, Logger: a.log})
	if err != nil && a.ctx.Err() != nil {
		return fmt.Errorf("demo interrupted; its cluster was stopped and removed")
	}
	return err
}

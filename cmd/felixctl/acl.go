package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/felix-broker/felix/auth"
)

type aclCmd struct {
	Grant  aclGrantCmd  `cmd:"" help:"Give a principal a permission (needs cluster.admin)."`
	Revoke aclRevokeCmd `cmd:"" help:"Take a permission back (needs cluster.admin)."`
	Ls     aclLsCmd     `cmd:"" aliases:"list" help:"List the permissions granted (needs cluster.read)."`
}

// grantArgs are the three words of a grant: who, what, on which streams.
type grantArgs struct {
	Principal string `arg:"" help:"Principal: the common name of a client certificate."`
	Action    string `arg:"" help:"publish, subscribe, stream.admin, cluster.read or cluster.admin."`
	Pattern   string `arg:"" optional:"" default:"*" help:"Streams: a name, a prefix ending in '*' (orders.*), or * for all (the default; the only choice for cluster actions)."`
}

func (g grantArgs) grant() (auth.Grant, error) {
	gr := auth.Grant{Principal: g.Principal, Action: auth.Action(g.Action), Pattern: g.Pattern}
	if err := gr.Validate(); err != nil {
		return gr, usagef("%s", strings.TrimPrefix(err.Error(), "auth: "))
	}
	return gr, nil
}

type aclGrantCmd struct {
	grantArgs
}

type aclRevokeCmd struct {
	grantArgs
}

type aclLsCmd struct {
}

// grantJSON is a grant as --json prints it.
type grantJSON struct {
	Principal string `json:"principal"`
	Action    string `json:"action"`
	Pattern   string `json:"pattern"`
}

func (c *aclGrantCmd) Run(a *app) error {
	g, err := c.grant()
	if err != nil {
		return err
	}
	return request(a, a.flags, "", func(ctx context.Context, cl *conn) error {
		if err := cl.Grant(ctx, g); err != nil {
			return err
		}
		if a.flags.JSON {
			return printJSON(a.stdout, map[string]any{"granted": grantJSON{Principal: g.Principal, Action: string(g.Action), Pattern: g.Pattern}})
		}
		fmt.Fprintf(a.stdout, "granted: %s\n", g)
		return nil
	})
}

func (c *aclRevokeCmd) Run(a *app) error {
	g, err := c.grant()
	if err != nil {
		return err
	}
	return request(a, a.flags, "", func(ctx context.Context, cl *conn) error {
		if err := cl.Revoke(ctx, g); err != nil {
			return err
		}
		if a.flags.JSON {
			return printJSON(a.stdout, map[string]any{"revoked": grantJSON{Principal: g.Principal, Action: string(g.Action), Pattern: g.Pattern}})
		}
		fmt.Fprintf(a.stdout, "revoked: %s\n", g)
		return nil
	})
}

func (c *aclLsCmd) Run(a *app) error {
	g := a.flags
	return request(a, g, "", func(ctx context.Context, cl *conn) error {
		grants, err := cl.Grants(ctx)
		if err != nil {
			return err
		}
		if g.JSON {
			for _, gr := range grants {
				if err := printJSON(a.stdout, grantJSON{Principal: gr.Principal, Action: string(gr.Action), Pattern: gr.Pattern}); err != nil {
					return err
				}
			}
			return nil
		}
		if len(grants) == 0 {
			fmt.Fprintln(a.stdout, "no permissions granted (superusers, set on the control plane, may do everything)")
			return nil
		}
		tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PRINCIPAL\tACTION\tSTREAMS")
		for _, gr := range grants {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", gr.Principal, gr.Action, gr.Pattern)
		}
		return tw.Flush()
	})
}

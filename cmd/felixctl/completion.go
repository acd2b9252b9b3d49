package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/alecthomas/kong"
)

// completionCmd prints a completion script generated from the command
// line's own model (no dependency beyond kong): commands, subcommands and
// flags, for bash and for zsh (through zsh's bashcompinit).
type completionCmd struct {
	Shell string `arg:"" enum:"bash,zsh" help:"bash or zsh. Load it with: eval \"$(felixctl completion bash)\" (in ~/.bashrc), or the same with zsh in ~/.zshrc."`
}

func (c *completionCmd) Run(a *app) error {
	if c.Shell == "zsh" {
		fmt.Fprintln(a.stdout, "# felixctl completion for zsh, through bash completion")
		fmt.Fprintln(a.stdout, "autoload -U +X bashcompinit && bashcompinit")
	}
	return writeBashCompletion(a.stdout, a.model)
}

// writeBashCompletion writes a bash completion function for app: for each
// command path, the words that may follow it (its visible subcommands and
// flags, the global flags included).
func writeBashCompletion(w io.Writer, app *kong.Application) error {
	words := map[string][]string{}
	var walk func(n *kong.Node, path string)
	walk = func(n *kong.Node, path string) {
		var ws []string
		for _, ch := range n.Children {
			if ch.Hidden {
				continue
			}
			ws = append(ws, ch.Name)
			ws = append(ws, ch.Aliases...)
		}
		for _, group := range n.AllFlags(true) {
			for _, f := range group {
				ws = append(ws, "--"+f.Name)
				switch neg := f.Tag.Negatable; neg {
				case "":
				case "_": // kong's placeholder for the default --no-NAME
					ws = append(ws, "--no-"+f.Name)
				default:
					ws = append(ws, "--"+neg)
				}
			}
		}
		slices.Sort(ws)
		words[path] = slices.Compact(ws)
		for _, ch := range n.Children {
			if ch.Hidden {
				continue
			}
			for _, name := range append([]string{ch.Name}, ch.Aliases...) {
				walk(ch, strings.TrimSpace(path+" "+name))
			}
		}
	}
	walk(app.Node, "")
	paths := make([]string, 0, len(words))
	for p := range words {
		paths = append(paths, p)
	}
	slices.Sort(paths)

	var b strings.Builder
	b.WriteString(`# felixctl completion for bash: eval "$(felixctl completion bash)"
_felixctl_words() {
  case "$1" in
`)
	for _, p := range paths {
		fmt.Fprintf(&b, "    %q) echo %q ;;\n", p, strings.Join(words[p], " "))
	}
	b.WriteString(`  esac
}
_felixctl() {
  local cur path w i
  cur="${COMP_WORDS[COMP_CWORD]}"
  path=""
  for ((i = 1; i < COMP_CWORD; i++)); do
    w="${COMP_WORDS[i]}"
    case "$w" in -*) continue ;; esac
    case " $(_felixctl_words "$path") " in
      *" $w "*) path="${path:+$path }$w" ;;
    esac
  done
  COMPREPLY=($(compgen -W "$(_felixctl_words "$path")" -- "$cur"))
}
complete -o default -F _felixctl felixctl
`)
	_, err := io.WriteString(w, b.String())
	return err
}

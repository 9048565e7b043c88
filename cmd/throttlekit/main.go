package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	goredis "github.com/redis/go-redis/v9"
)

// Exit statuses. doc.go and the top-level usage list them; scripts rely on
// them, so they never change meaning.
const (
	exitOK          = 0 // the command did what was asked
	exitFailed      = 1 // a backend failed or could not be reached
	exitUsage       = 2 // bad flags or arguments: nothing was done
	exitInterrupted = 3 // SIGINT or SIGTERM stopped the command early
	exitNotFound    = 4 // inspect: no side holds any state for the identifier
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes the command line args and returns the exit status. The
// first SIGINT or SIGTERM cancels the command's context (cleanup then
// stops after the batch in flight and prints its summary); a second one
// kills the process, as signal handling is restored once the first
// arrives.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	goredis.SetLogger(quietRedisLogger{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop()
	}()
	return execute(ctx, &app{stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv}, args)
}

// app is what a command runs with: its streams, its environment, and the
// hooks tests use.
type app struct {
	stdin          io.Reader // no command reads it yet
	stdout, stderr io.Writer
	getenv         func(string) string
	// afterBatch, when set, is called by cleanup after each batch of keys
	// it has handled, with the number of batches so far (tests cancel the
	// context from it).
	afterBatch func(batches int64)
}

// command is one subcommand.
type command struct {
	name    string
	args    string // the positional arguments, for the usage line
	summary string
	run     func(ctx context.Context, a *app, args []string) error
}

func commands() []command {
	return []command{
		{"inspect", "ID", "show an identifier's usage on every side, consuming nothing", runInspect},
		{"reset", "ID", "forget an identifier's state on every side", runReset},
		{"cleanup", "", "delete the Redis keys of an old key prefix, paced and resumable", runCleanup},
		{"explain", "POLICY", "print a policy's limits and the keys it stores", runExplain},
	}
}

// Errors that choose the exit status.
var (
	// errInterrupted ends a command that a signal stopped early.
	errInterrupted = errors.New("interrupted")
	// errNotFound ends an inspect that found no state on any side.
	errNotFound = errors.New("no state stored")
	// errReported ends a command whose failure its output already
	// describes (a side's error in a table or JSON document).
	errReported = errors.New("failed")
)

// usageError is a bad flag or argument: the command did nothing.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// execute runs args under ctx and returns the exit status.
func execute(ctx context.Context, a *app, args []string) int {
	if len(args) == 0 {
		printTopUsage(a.stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help", "help":
		if name == "help" && len(args) > 1 {
			if c, ok := findCommand(args[1]); ok {
				return execute(ctx, a, []string{c.name, "--help"})
			}
			fmt.Fprintf(a.stderr, "throttlekit: unknown command %q\n", args[1])
			printTopUsage(a.stderr)
			return exitUsage
		}
		printTopUsage(a.stdout)
		return exitOK
	}
	c, ok := findCommand(name)
	if !ok {
		fmt.Fprintf(a.stderr, "throttlekit: unknown command %q\n\n", name)
		printTopUsage(a.stderr)
		return exitUsage
	}
	err := c.run(ctx, a, args[1:])
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(a.stderr, "throttlekit %s: %s\nRun 'throttlekit %s --help' for usage.\n", c.name, ue.msg, c.name)
		return exitUsage
	case errors.Is(err, errNotFound):
		return exitNotFound
	case errors.Is(err, errInterrupted) || ctx.Err() != nil:
		if !errors.Is(err, errInterrupted) {
			fmt.Fprintf(a.stderr, "throttlekit %s: interrupted: %v\n", c.name, err)
		}
		return exitInterrupted
	case errors.Is(err, errReported):
		return exitFailed
	default:
		fmt.Fprintf(a.stderr, "throttlekit %s: %v\n", c.name, err)
		return exitFailed
	}
}

func findCommand(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

func printTopUsage(w io.Writer) {
	var b strings.Builder
	b.WriteString(`throttlekit inspects, resets and cleans up the state throttlekit stores.

Usage:
  throttlekit <command> [flags] [arguments]
  throttlekit help <command>

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(&b, "  %-16s %s\n", strings.TrimSpace(c.name+" "+c.args), c.summary)
	}
	b.WriteString(`
Every command but explain needs a backend: one of --redis, --redis-cluster,
--redis-groups or --memcached, or a rollout's two sides as --old and --new
(see 'throttlekit inspect --help'). Flags may come before or after the
arguments; --json prints one JSON document for scripts.

Exit status:
  0  success
  1  a backend failed or could not be reached
  2  usage error: bad flags or arguments, nothing was done
  3  interrupted by SIGINT or SIGTERM (cleanup prints what it did; rerun it to finish)
  4  inspect found no state for the identifier on any side
`)
	io.WriteString(w, b.String())
}

// parseFlags parses args with fs, allowing positional arguments between
// flags ("inspect user:42 --policy 10/s"), and returns the positional
// arguments. Everything after "--" is positional. -h and --help print the
// command's usage to stdout and return flag.ErrHelp; a bad flag is a
// usageError.
func parseFlags(fs *flag.FlagSet, a *app, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var positional []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(a.stdout)
			fs.Usage()
			return nil, flag.ErrHelp
		}
		if err != nil {
			return nil, &usageError{msg: err.Error()}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// newFlagSet returns a FlagSet for command c whose Usage prints the
// command's synopsis, description and flags.
func newFlagSet(c, synopsis, description string) *flag.FlagSet {
	fs := flag.NewFlagSet(c, flag.ContinueOnError)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage:\n  throttlekit %s\n\n%s\nFlags:\n", synopsis, description)
		printFlags(w, fs)
		fmt.Fprint(w, exitStatusHelp)
	}
	return fs
}

// printFlags lists fs's flags as flag.PrintDefaults does, but with the
// double dash people type.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			line += " (default " + f.DefValue + ")"
		}
		fmt.Fprintln(w, line)
	})
}

// quietRedisLogger drops go-redis's internal log lines (connection pool
// retries and the like): every failure reaches the command as an error,
// which it reports itself.
type quietRedisLogger struct{}

func (quietRedisLogger) Printf(context.Context, string, ...any) {}

const exitStatusHelp = `
Exit status: 0 success, 1 backend failure, 2 usage error, 3 interrupted,
4 nothing found (inspect only).
`

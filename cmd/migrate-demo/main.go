package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Exit statuses.
const (
	exitPass    = 0
	exitFail    = 1 // the run broke an invariant, or was interrupted
	exitCannot  = 2 // the demo could not run: missing servers, unreachable stores
	exitBadArgs = 64
)

func main() {
	os.Exit(mainStatus(os.Args[1:]))
}

func mainStatus(args []string) int {
	cfg, err := parseConfig(args, os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitPass
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "migrate-demo:", err)
		return exitBadArgs
	}
	cfg.ProgressInPlace = isTerminal(os.Stdout)

	// The first SIGINT or SIGTERM ends the run cleanly: the load stops,
	// the API and the servers the demo started are shut down. A second one
	// kills the process at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop()
	}()

	v, err := run(ctx, cfg, os.Stdout)
	if err != nil {
		var missing *MissingServersError
		if errors.As(err, &missing) {
			fmt.Fprintln(os.Stderr, "migrate-demo:", err)
		} else {
			fmt.Fprintln(os.Stderr, "migrate-demo: cannot run:", err)
		}
		if errors.Is(err, errUsage) {
			return exitBadArgs
		}
		return exitCannot
	}
	if !v.Pass {
		return exitFail
	}
	return exitPass
}

// isTerminal reports whether f is a character device, where progress can
// rewrite one line in place.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
